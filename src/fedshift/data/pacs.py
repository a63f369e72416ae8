"""PACS (Li et al., "Deeper, Broader and Artier Domain Generalization", ICCV 2017), read as
its authors distribute it.

Layout: images under ``ROOT/kfold/<domain>/<class>/*.jpg`` (or ``ROOT/<domain>/<class>/``) and
the official split lists ``ROOT/<domain>_{train,crossval,test}_kfold.txt``, one
``<domain>/<class>/<file> <label>`` per line with 1-based labels in the authors' class order.
``train`` and ``crossval`` become the train and val splits; ``test_kfold`` lists every image of
the domain, so a held-out target domain is scored on all its images (the DG papers' protocol).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from fedshift.data.domains import DatasetError, Domain, DomainDataset, Split
from fedshift.data.folder import read_image

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
    if not path.is_file():
        raise DatasetError(f"missing split list {path} (expected {LAYOUT})")
    entries = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            parts = line.split()
            if not parts:
                continue
            where = f"{path.name} line {number}"
            if len(parts) != 2 or not parts[1].isdigit():
                raise DatasetError(f"{where}: expected '<domain>/<class>/<file> <label>'")
            relative, label = parts[0], int(parts[1])
            if not 1 <= label <= len(CLASSES):
                raise DatasetError(f"{where}: label {label} is not in 1..{len(CLASSES)}")
            folders = Path(relative).parts
            if len(folders) >= 2 and folders[-2] in CLASSES and folders[-2] != CLASSES[label - 1]:
                raise DatasetError(
                    f"{where}: label {label} ({CLASSES[label - 1]}) but the image is in "
                    f"folder {folders[-2]!r}"
                )
            image = images / relative
            if not image.is_file():
                raise DatasetError(f"{where} names a missing file {image}")
            entries.append((image, label - 1))
    return entries


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


def load_pacs(root: str | os.PathLike, *, image_size: int = RESOLUTION) -> DomainDataset:
    """PACS from ``root`` with the official splits, images as RGB ``image_size`` squares."""
    if int(image_size) < 1:
        raise DatasetError(f"image_size must be a positive integer, got {image_size}")
    image_size = int(image_size)
    entries = split_entries(root)
    workers = max(1, min(8, os.cpu_count() or 1))
    domains = {}
    counts = {}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for domain, splits in entries.items():
            # the lists overlap (test_kfold is the whole domain): decode each image once
            paths = sorted({path for items in splits.values() for path, _ in items})
            if not paths:
                raise DatasetError(f"the split lists of pacs/{domain} name no image")
            row = {path: i for i, path in enumerate(paths)}
            pixels = torch.from_numpy(
                np.stack(list(pool.map(lambda p: read_image(p, image_size), paths)))
            )
            parts = {}
            for split, items in splits.items():
                index = torch.as_tensor([row[path] for path, _ in items], dtype=torch.long)
                labels = torch.as_tensor([label for _, label in items], dtype=torch.long)
                parts[split] = Split(x=pixels[index], y=labels)
            domains[domain] = Domain(name=domain, **parts)
            counts[domain] = {split: len(items) for split, items in splits.items()}
    return DomainDataset(
        name=NAME,
        domains=domains,
        classes=list(CLASSES),
        channels=3,
        image_size=image_size,
        meta={
            "source": NAME,
            "root": str(Path(root).expanduser().resolve()),
            "layout": LAYOUT,
            "split": "official kfold lists (train, crossval as val, test = the whole domain)",
            "counts": counts,
        },
    )
