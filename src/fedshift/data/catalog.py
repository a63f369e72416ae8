"""The dataset catalog: each entry's source, layout, split and official counts, and a checker.

``check_dataset(name, root)`` validates a user's copy against the layout its authors
distribute and returns the per-domain, per-split image counts plus one-line warnings where a
count differs from the official one. It reads only directory listings, split lists and
binary headers, so it is cheap on DomainNet-sized trees.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from fedshift.data import digit_five, elcfs_sets, pacs
from fedshift.data.domains import DatasetError
from fedshift.data.lists import VAL_FRACTION, held_out_count

_IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"})


@dataclass(frozen=True)
class CatalogEntry:
    """One dataset as its authors distribute it."""

    name: str
    source: str
    layout: str
    split: str
    domains: tuple[str, ...]
    resolution: int
    official_totals: dict[str, int] = field(default_factory=dict)
    list_pattern: tuple[str, ...] = ()
    image_subdir: str = ""
    classes: tuple[str, ...] = ()  # in label order; empty: the class folders found


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

CATALOG: dict[str, CatalogEntry] = {
    e.name: e
    for e in (
        CatalogEntry(
            pacs.NAME,
            "PACS (Li et al., ICCV 2017)",
            pacs.LAYOUT,
            "official kfold lists: train, crossval as val, test_kfold (the whole domain) as "
            "test; labels 1-based in the authors' class order; target: whole domain",
            pacs.DOMAINS,
            pacs.RESOLUTION,
            dict(pacs.OFFICIAL_TOTALS),
            ("{d}_train_kfold.txt", "{d}_crossval_kfold.txt", "{d}_test_kfold.txt"),
            "kfold",
            pacs.CLASSES,
        ),
        CatalogEntry(
            "office-home",
            "Office-Home (Venkateswara et al., CVPR 2017)",
            "ROOT/<domain>/<class>/<image>, domains Art, Clipart, Product, 'Real World'",
            "DomainBed 80/20 seeded holdout; target: whole domain",
            ("Art", "Clipart", "Product", "Real World"),
            224,
            {"Art": 2427, "Clipart": 4365, "Product": 4439, "Real World": 4357},
        ),
        CatalogEntry(
            "vlcs",
            "VLCS (Fang et al., ICCV 2013), DomainBed layout",
            "ROOT/<domain>/<class>/<image>",
            "DomainBed 80/20 seeded holdout; target: whole domain",
            ("Caltech101", "LabelMe", "SUN09", "VOC2007"),
            224,
            {"Caltech101": 1415, "LabelMe": 2656, "SUN09": 3282, "VOC2007": 3376},
        ),
        CatalogEntry(
            "terra-incognita",
            "Terra Incognita (Beery et al., ECCV 2018), DomainBed layout",
            "ROOT/<domain>/<class>/<image>",
            "DomainBed 80/20 seeded holdout; target: whole domain",
            ("location_100", "location_38", "location_43", "location_46"),
            224,
            {"location_100": 4741, "location_38": 9736, "location_43": 3970, "location_46": 5883},
        ),
        CatalogEntry(
            "domainnet",
            "DomainNet (Peng et al., ICCV 2019)",
            "ROOT/<domain>/<class>/<image> + ROOT/<domain>_train.txt, ROOT/<domain>_test.txt",
            "official train/test lists, class order = the lists' labels (val: a seeded "
            "stratified 0.2 of the train list); target: its official test list",
            ("clipart", "infograph", "painting", "quickdraw", "real", "sketch"),
            224,
            {
                "clipart": 48129,
                "infograph": 51605,
                "painting": 72266,
                "quickdraw": 172500,
                "real": 172947,
                "sketch": 69128,
            },
            ("{d}_train.txt", "{d}_test.txt"),
        ),
        CatalogEntry(
            "domainnet10",
            "DomainNet 10-class subset of FedBN (bird .. zebra)",
            "as domainnet (only the 10 classes are read)",
            "official DomainNet train/test lists restricted to the 10 classes, relabelled "
            "0..9 in this order (val: a seeded stratified 0.2 of the train list)",
            ("clipart", "infograph", "painting", "quickdraw", "real", "sketch"),
            224,
            {},
            ("{d}_train.txt", "{d}_test.txt"),
            classes=DOMAINNET10_CLASSES,
        ),
        CatalogEntry(
            "office-caltech10",
            "Office-Caltech10 (Gong et al., CVPR 2012)",
            "ROOT/<domain>/<class>/<image>",
            "DomainBed 80/20 seeded holdout; target: whole domain",
            ("amazon", "caltech", "dslr", "webcam"),
            224,
            {"amazon": 958, "caltech": 1123, "dslr": 157, "webcam": 295},
        ),
        CatalogEntry(
            "office31",
            "Office-31 (Saenko et al., ECCV 2010)",
            "ROOT/<domain>/images/<class>/<image> or ROOT/<domain>/<class>/<image>",
            "DomainBed 80/20 seeded holdout; target: whole domain",
            ("amazon", "dslr", "webcam"),
            224,
            {"amazon": 2817, "dslr": 498, "webcam": 795},
        ),
        CatalogEntry(
            "cifar10",
            "CIFAR-10 binary version (Krizhevsky 2009)",
            "ROOT/cifar-10-batches-bin/data_batch_{1..5}.bin, test_batch.bin (3073-byte records)",
            "official train/test files (val: a seeded stratified 0.2 of the train files)",
            ("cifar10",),
            32,
            {"cifar10": 60000},
        ),
        CatalogEntry(
            "cifar100",
            "CIFAR-100 binary version (Krizhevsky 2009)",
            "ROOT/cifar-100-binary/train.bin, test.bin (3074-byte records)",
            "official train/test files, fine labels (val: a seeded stratified 0.2 of train.bin)",
            ("cifar100",),
            32,
            {"cifar100": 60000},
        ),
        CatalogEntry(
            digit_five.NAME,
            "Digit-Five (MNIST, MNIST-M, SVHN, USPS, SynDigits; M3SDA, KD3A, FACT)",
            digit_five.LAYOUT,
            digit_five.SPLIT,
            digit_five.DOMAINS,
            digit_five.RESOLUTION,
            {d: sum(s.values()) for d, s in digit_five.OFFICIAL.items()},
            classes=digit_five.CLASSES,
        ),
        *(
            CatalogEntry(
                spec.name,
                f"{spec.name.capitalize()} multi-site segmentation set of FedDG-ELCFS "
                "(Liu et al., CVPR 2021), official release layout; problem=segmentation, "
                f"mask channels {'/'.join(spec.mask_channels)}, metric: {elcfs_sets.METRIC}",
                spec.layout,
                elcfs_sets.SPLIT,
                spec.sites,
                elcfs_sets.RESOLUTION,
                dict(spec.official_counts),
                classes=spec.mask_channels,
            )
            for spec in elcfs_sets.SETS.values()
        ),
    )
}


def _image_count(path: Path) -> int:
    count = 0
    for _dirpath, dirs, files in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        count += sum(
            1 for f in files if not f.startswith(".") and Path(f).suffix.lower() in _IMAGE_SUFFIXES
        )
    return count


def _holdout_counts(class_sizes: list[int]) -> dict[str, int]:
    """The train / val / test sizes a DomainBed holdout gives a domain with ``class_sizes``
    (val: :data:`~fedshift.data.lists.VAL_FRACTION` of each class; test: the whole domain)."""
    held = sum(held_out_count(n, VAL_FRACTION) for n in class_sizes)
    total = sum(class_sizes)
    return {"train": total - held, "val": held, "test": total}


def _folder_counts(entry: CatalogEntry, folder: Path) -> dict[str, int]:
    """Per-split sizes of one class-folder domain, as the loader splits it."""
    if entry.name == "office31" and (folder / "images").is_dir():
        folder = folder / "images"
    sizes = [
        _image_count(c)
        for c in sorted(folder.iterdir())
        if c.is_dir() and not c.name.startswith(".")
    ]
    if not any(sizes):
        raise DatasetError(f"domain folder {folder} holds no image in a class folder")
    return _holdout_counts(sizes)


def _list_class_sizes(path: Path, classes: tuple[str, ...] = ()) -> list[int]:
    """Images per class of a split list (``<domain>/<class>/<file> <label>``), only
    ``classes`` if given."""
    if not path.is_file():
        raise DatasetError(f"missing split file {path} (expected by the official layout)")
    wanted = frozenset(classes)
    sizes: dict[str, int] = {}
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if not line.strip():
                continue
            parts = line.split()[0].split("/")
            name = parts[-2] if len(parts) > 2 else ""
            if wanted and name not in wanted:
                continue
            sizes[name] = sizes.get(name, 0) + 1
    return list(sizes.values())


def _check_cifar(entry: CatalogEntry, root: Path) -> dict[str, dict[str, int]]:
    if entry.name == "cifar10":
        folder, record = root / "cifar-10-batches-bin", 3073
        files = {
            "train": [f"data_batch_{i}.bin" for i in range(1, 6)],
            "test": ["test_batch.bin"],
        }
    else:
        folder, record = root / "cifar-100-binary", 3074
        files = {"train": ["train.bin"], "test": ["test.bin"]}
    counts = {}
    for split, names in files.items():
        total = 0
        for name in names:
            path = folder / name
            if not path.is_file():
                raise DatasetError(f"missing file {path} ({entry.layout})")
            size = path.stat().st_size
            if size % record:
                raise DatasetError(f"{path} is not a whole number of {record}-byte records")
            total += size // record
        counts[split] = total
    return {entry.domains[0]: counts}


def check_dataset(
    name: str, root: str | os.PathLike
) -> tuple[dict[str, dict[str, int]], list[str]]:
    """Validate ``root`` as catalog entry ``name``: (per-domain per-split counts, warnings)."""
    if name not in CATALOG:
        raise DatasetError(f"unknown dataset {name!r}; the catalog has {', '.join(CATALOG)}")
    entry = CATALOG[name]
    root = Path(root)
    if not root.is_dir():
        raise DatasetError(f"dataset root {root} does not exist (expected {entry.layout})")
    if name == pacs.NAME:
        entries = pacs.split_entries(root)
        pacs.check_images(entries)
        counts = {d: {s: len(v) for s, v in splits.items()} for d, splits in entries.items()}
        return counts, pacs.count_warnings(counts)
    if name in elcfs_sets.SETS:
        return elcfs_sets.check_elcfs(name, root)
    if name == digit_five.NAME:
        return digit_five.check(root)
    if name.startswith("cifar"):
        counts = _check_cifar(entry, root)
    else:
        image_root = root / entry.image_subdir if (root / entry.image_subdir).is_dir() else root
        counts = {}
        for domain in entry.domains:
            folder = image_root / domain
            if not folder.is_dir():
                raise DatasetError(f"missing domain folder {folder} (expected {entry.layout})")
            if entry.list_pattern:
                train, test = (
                    _list_class_sizes(root / p.format(d=domain), entry.classes)
                    for p in entry.list_pattern
                )
                counts[domain] = {**_holdout_counts(train), "test": sum(test)}
            else:
                counts[domain] = _folder_counts(entry, folder)
    warnings = []
    for domain, official in entry.official_totals.items():
        split_counts = counts[domain]
        if entry.list_pattern:
            found = split_counts["train"] + split_counts["val"] + split_counts["test"]
        elif entry.name.startswith("cifar"):
            found = split_counts["train"] + split_counts["test"]
        else:
            found = split_counts["test"]
        if found != official:
            warnings.append(f"{name}/{domain}: {found} images, the official copy has {official}")
    return counts, warnings
