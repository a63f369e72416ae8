"""PACS (Li et al., "Deeper, Broader and Artier Domain Generalization", ICCV 2017), read as
its authors distribute it.

Layout: images under ``ROOT/kfold/<domain>/<class>/*.jpg`` (or ``ROOT/<domain>/<class>/``) and
the official split lists ``ROOT/<domain>_{train,crossval,test}_kfold.txt``, one
``<domain>/<class>/<file> <label>`` per line with 1-based labels in the authors' class order.
``train`` and ``crossval`` become the train and val splits; ``test_kfold`` lists every image of
the domain, so a held-out target domain is scored on all its images (the DG papers' protocol).
:mod:`fedshift.data.catalog_loaders` decodes the entries.
"""

from __future__ import annotations

import os
from pathlib import Path

from fedshift.data import lists
from fedshift.data.domains import DatasetError

NAME = "pacs"
DOMAINS = ("art_painting", "cartoon", "photo", "sketch")
#: the authors' class order: label k in the lists is CLASSES[k - 1]
CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")
#: fedshift split -> the authors' list file for a domain
SPLIT_LISTS = {
    "train": "{domain}_train_kfold.txt",
    "val": "{domain}_crossval_kfold.txt",
    "test": "{domain}_test_kfold.txt",
}
#: images per domain in the official copy (each domain's test_kfold list)
OFFICIAL_TOTALS = {"art_painting": 2048, "cartoon": 2344, "photo": 1670, "sketch": 3929}
RESOLUTION = 224
LAYOUT = (
    "ROOT/kfold/<domain>/<class>/*.jpg (or ROOT/<domain>/<class>/) + "
    "ROOT/<domain>_{train,crossval,test}_kfold.txt"
)


def image_root(root: Path) -> Path:
    """Where the domain folders lie: ``ROOT/kfold`` when present, else ``ROOT``."""
    kfold = root / "kfold"
    return kfold if kfold.is_dir() else root


def read_split_list(path: Path, images: Path) -> list[tuple[Path, int]]:
    """The (image path, 0-based label) entries of one official list; bad lines raise."""
    return lists.read_split_list(path, images, CLASSES, label_base=1, layout=LAYOUT)


def split_entries(root: str | os.PathLike) -> dict[str, dict[str, list[tuple[Path, int]]]]:
    """Domain -> split -> entries of the official lists, every named file checked to exist."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DatasetError(f"dataset root {root} does not exist (expected {LAYOUT})")
    images = image_root(root)
    out = {}
    for domain in DOMAINS:
        if not (images / domain).is_dir():
            raise DatasetError(f"missing domain folder {images / domain} (expected {LAYOUT})")
        out[domain] = {
            split: read_split_list(root / pattern.format(domain=domain), images)
            for split, pattern in SPLIT_LISTS.items()
        }
    return out


def check_images(entries: dict[str, dict[str, list[tuple[Path, int]]]]) -> None:
    """Open the header of every listed image once; an unreadable one raises DatasetError."""
    from PIL import Image, UnidentifiedImageError

    seen = {path for splits in entries.values() for items in splits.values() for path, _ in items}
    for path in sorted(seen):
        try:
            with Image.open(path) as im:
                im.verify()
        except (OSError, UnidentifiedImageError, ValueError, SyntaxError) as exc:
            raise DatasetError(f"unreadable image file {path}: {exc}") from None


def count_warnings(counts: dict[str, dict[str, int]]) -> list[str]:
    """One line per domain whose image count (its test_kfold list) differs from the official."""
    return [
        f"pacs/{domain}: {counts[domain]['test']} images, the official copy has {official}"
        for domain, official in OFFICIAL_TOTALS.items()
        if counts[domain]["test"] != official
    ]
