"""DomainNet (Peng et al., ICCV 2019) and FedBN's 10-class subset, read with the official
``ROOT/<domain>_train.txt`` / ``_test.txt`` lists: they define the splits and the class
order. DomainNet has no validation list: a seeded stratified ``VAL_FRACTION`` of its train
list becomes val; its test list is the test split (a held-out target is scored on it)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedshift.data.catalog.base import ImageListDataset, Splits, domain_holdout
from fedshift.data.domains import DatasetError
from fedshift.data.lists import VAL_FRACTION, list_classes, read_split_list

#: the official lists of a domain: train, then test
LISTS = ("{d}_train.txt", "{d}_test.txt")
DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
DOMAINNET10_CLASSES = (
    "bird",
    "feather",
    "headphones",
    "ice_cream",
    "teapot",
    "tiger",
    "whale",
    "windmill",
    "wine_glass",
    "zebra",
)


@dataclass(frozen=True, kw_only=True)
class DomainNetDataset(ImageListDataset):
    """DomainNet's official lists; with :attr:`classes`, only those classes, relabelled."""

    def class_names(self, root: Path, domains: Sequence[str]) -> list[str]:
        """The fixed classes, else the order ``domains``' official lists give."""
        if self.classes:
            return list(self.classes)
        lists = [root / p.format(d=d) for d in domains for p in LISTS]
        for path in lists:
            if not path.is_file():
                raise DatasetError(f"missing split list {path} (expected {self.layout})")
        return list_classes(lists)

    def official_splits(
        self, root: Path, classes: list[str], seed: int, domains: Sequence[str]
    ) -> tuple[Splits, str]:
        keep = {c: i for i, c in enumerate(classes)} if self.classes else None
        out = {}
        for domain in domains:
            self.domain_dir(root, domain)
            train, test = (
                read_split_list(
                    root / p.format(d=domain), root, classes, layout=self.layout, keep=keep
                )
                for p in LISTS
            )
            kept, val = domain_holdout(train, seed, domain)
            out[domain] = {"train": kept, "val": val, "test": test}
        subset = " restricted to FedBN's 10 classes" if self.classes else ""
        return out, (
            f"official train/test lists{subset}; val: a seeded stratified {VAL_FRACTION:g} of "
            f"the train list (split_seed={seed}); test: the test list"
        )


_LAYOUT = "ROOT/<domain>/<class>/<image> + ROOT/<domain>_train.txt, ROOT/<domain>_test.txt"
DOMAINNET = DomainNetDataset(
    name="domainnet",
    source="DomainNet (Peng et al., ICCV 2019)",
    layout=_LAYOUT,
    split=(
        "official train/test lists, class order = the lists' labels (val: a seeded "
        "stratified 0.2 of the train list); target: its official test list"
    ),
    domains=DOMAINS,
    resolution=224,
    official_totals={
        "clipart": 48129,
        "infograph": 51605,
        "painting": 72266,
        "quickdraw": 172500,
        "real": 172947,
        "sketch": 69128,
    },
    description="345 object classes in 6 styles, the largest DG benchmark",
    class_source="the official lists' labels, each naming one class folder (345 classes)",
)
DOMAINNET10 = DomainNetDataset(
    name="domainnet10",
    source="DomainNet 10-class subset of FedBN (bird .. zebra)",
    layout="as domainnet (only the 10 classes are read)",
    split=(
        "official DomainNet train/test lists restricted to the 10 classes, relabelled "
        "0..9 in this order (val: a seeded stratified 0.2 of the train list)"
    ),
    domains=DOMAINS,
    resolution=224,
    classes=DOMAINNET10_CLASSES,
    description="DomainNet's 10 classes used by FedBN, in 6 styles",
    class_source="FedBN's subset, by class folder, relabelled 0..9 in this order",
)
