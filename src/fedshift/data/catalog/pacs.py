"""PACS (Li et al., "Deeper, Broader and Artier Domain Generalization", ICCV 2017), read as
its authors distribute it.

Layout: images under ``ROOT/kfold/<domain>/<class>/*.jpg`` (or ``ROOT/<domain>/<class>/``) and
the official split lists ``ROOT/<domain>_{train,crossval,test}_kfold.txt``, one
``<domain>/<class>/<file> <label>`` per line with 1-based labels in the authors' class order.
``train`` and ``crossval`` become the train and val splits; ``test_kfold`` lists every image of
the domain, so a held-out target domain is scored on all its images (the DG papers' protocol).
Loaded for a protocol whose scored domains also train (``held_out_test``), the test split is
instead image ``i`` of the ``test_kfold`` list when ``i % 10 > 7`` (FPL's rule, 20 %), those
images leaving the train and crossval lists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedshift.data.catalog.base import ImageListDataset, Splits
from fedshift.data.lists import read_split_list

#: fedshift split -> the authors' list file for a domain
SPLIT_LISTS = {
    "train": "{domain}_train_kfold.txt",
    "val": "{domain}_crossval_kfold.txt",
    "test": "{domain}_test_kfold.txt",
}


@dataclass(frozen=True, kw_only=True)
class PacsDataset(ImageListDataset):
    """PACS with its official kfold lists."""

    whole_domain_test: bool = True

    def image_root(self, root: Path) -> Path:
        """``ROOT/kfold`` when present, else ``ROOT``."""
        kfold = root / "kfold"
        return kfold if kfold.is_dir() else root

    def class_names(self, root: Path, domains: Sequence[str]) -> list[str]:
        return list(self.classes)

    def official_splits(
        self, root: Path, classes: list[str], seed: int, domains: Sequence[str]
    ) -> tuple[Splits, str]:
        return self.split_entries(root, domains), (
            "official kfold lists (train, crossval as val, test = the whole domain)"
        )

    def split_entries(self, root: Path, domains: Sequence[str]) -> Splits:
        """Domain -> split -> entries of ``domains``' official lists, every named file
        checked to exist."""
        images = self.image_root(root)
        out = {}
        for domain in domains:
            self.domain_dir(root, domain)
            out[domain] = {
                split: read_split_list(
                    root / pattern.format(domain=domain),
                    images,
                    self.classes,
                    label_base=1,
                    layout=self.layout,
                )
                for split, pattern in SPLIT_LISTS.items()
            }
        return out


PACS = PacsDataset(
    name="pacs",
    source="PACS (Li et al., ICCV 2017)",
    layout=(
        "ROOT/kfold/<domain>/<class>/*.jpg (or ROOT/<domain>/<class>/) + "
        "ROOT/<domain>_{train,crossval,test}_kfold.txt"
    ),
    split=(
        "official kfold lists: train, crossval as val, test_kfold (the whole domain) as "
        "test; labels 1-based in the authors' class order; target: whole domain; a domain "
        "that also trains: i % 10 > 7 of test_kfold held out as test (FPL's rule)"
    ),
    domains=("art_painting", "cartoon", "photo", "sketch"),
    resolution=224,
    official_totals={"art_painting": 2048, "cartoon": 2344, "photo": 1670, "sketch": 3929},
    # the authors' class order: label k in the lists is classes[k - 1]
    classes=("dog", "elephant", "giraffe", "guitar", "horse", "house", "person"),
    description="7 object classes as photos, art paintings, cartoons and sketches",
    class_source="the authors' order: label k of the kfold lists is the k-th",
)
