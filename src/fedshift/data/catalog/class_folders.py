"""The class-folder datasets, ``ROOT/<domain>/<class>/<image>`` with no official split list
(Office-Home, VLCS, Terra Incognita, Office-Caltech10, Office-31): each domain's images are
split by DomainBed's seeded 80/20 holdout (``split_seed``), stratified by class, into train /
val; the test split is the whole domain, so a held-out target domain is scored on all its
images (the domain-generalization protocol). Classes are the sorted class folder names
(DomainBed's ImageFolder order).

Loaded for a protocol whose scored domains also train (per-domain, personalized:
``held_out_test``), a domain's test split is instead FPL's official held-out part: in
ImageFolder order (sorted classes, then sorted files), image ``i`` is a test image when
``i % 10 > 7`` (20 %), and those images leave the DomainBed train / val split
(:func:`~fedshift.data.catalog.base.split_off_test`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedshift.data.catalog.base import ImageListDataset, Splits, domain_holdout
from fedshift.data.lists import VAL_FRACTION, class_folders, folder_entries

HOLDOUT_SPLIT = (
    "DomainBed 80/20 seeded holdout; target: whole domain; a domain that also trains: "
    "FPL's held-out 20 % (i % 10 > 7 in ImageFolder order) as test"
)
FOLDER_LAYOUT = "ROOT/<domain>/<class>/<image>"


@dataclass(frozen=True, kw_only=True)
class ClassFolderDataset(ImageListDataset):
    """``ROOT/<domain>/<class>/<image>`` split by a seeded per-domain holdout."""

    layout: str = FOLDER_LAYOUT
    split: str = HOLDOUT_SPLIT
    resolution: int = 224
    nested: str = ""  # a sub-folder of a domain that may hold its class folders
    class_source: str = "the class folders found, sorted (DomainBed's ImageFolder order)"
    whole_domain_test: bool = True

    def domain_dir(self, root: Path, domain: str) -> Path:
        folder = super().domain_dir(root, domain)
        if self.nested and (folder / self.nested).is_dir():
            return folder / self.nested
        return folder

    def class_names(self, root: Path, domains: Sequence[str]) -> list[str]:
        """The sorted class folders of ``domains`` (DomainBed's sets hold every class in
        every domain, so a subset finds the same classes as the whole copy)."""
        return class_folders([self.domain_dir(root, d) for d in domains])

    def official_splits(
        self, root: Path, classes: list[str], seed: int, domains: Sequence[str]
    ) -> tuple[Splits, str]:
        out = {}
        for domain in domains:
            everything = folder_entries(self.domain_dir(root, domain), classes)
            train, val = domain_holdout(everything, seed, domain)
            out[domain] = {"train": train, "val": val, "test": everything}
        return out, (
            f"DomainBed holdout: per domain a seeded stratified {1 - VAL_FRACTION:g}/"
            f"{VAL_FRACTION:g} train/val split (split_seed={seed}); test: the whole domain"
        )


OFFICE_HOME = ClassFolderDataset(
    name="office-home",
    source="Office-Home (Venkateswara et al., CVPR 2017)",
    layout="ROOT/<domain>/<class>/<image>, domains Art, Clipart, Product, 'Real World'",
    domains=("Art", "Clipart", "Product", "Real World"),
    official_totals={"Art": 2427, "Clipart": 4365, "Product": 4439, "Real World": 4357},
    description="65 office and home object classes in 4 styles",
)
VLCS = ClassFolderDataset(
    name="vlcs",
    source="VLCS (Fang et al., ICCV 2013), DomainBed layout",
    domains=("Caltech101", "LabelMe", "SUN09", "VOC2007"),
    official_totals={"Caltech101": 1415, "LabelMe": 2656, "SUN09": 3282, "VOC2007": 3376},
    description="5 object classes from 4 photo collections",
)
TERRA_INCOGNITA = ClassFolderDataset(
    name="terra-incognita",
    source="Terra Incognita (Beery et al., ECCV 2018), DomainBed layout",
    domains=("location_100", "location_38", "location_43", "location_46"),
    official_totals={
        "location_100": 4741,
        "location_38": 9736,
        "location_43": 3970,
        "location_46": 5883,
    },
    description="10 animal classes from camera traps at 4 locations",
)
OFFICE_CALTECH10 = ClassFolderDataset(
    name="office-caltech10",
    source="Office-Caltech10 (Gong et al., CVPR 2012)",
    domains=("amazon", "caltech", "dslr", "webcam"),
    official_totals={"amazon": 958, "caltech": 1123, "dslr": 157, "webcam": 295},
    description="10 object classes shared by Office-31 and Caltech-256",
)
OFFICE31 = ClassFolderDataset(
    name="office31",
    source="Office-31 (Saenko et al., ECCV 2010)",
    layout="ROOT/<domain>/images/<class>/<image> or ROOT/<domain>/<class>/<image>",
    domains=("amazon", "dslr", "webcam"),
    official_totals={"amazon": 2817, "dslr": 498, "webcam": 795},
    nested="images",
    description="31 office object classes from a web shop, a DSLR and a webcam",
)
