"""The plain folder fallback: a user's own ``ROOT/<domain>/<class>/<image>`` tree (any domain
and class names), read with the same image reader as the catalog's class-folder datasets
(:mod:`fedshift.data.formats.images`) and split per domain train / val / test, seeded."""

from __future__ import annotations

import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedshift.data.domains import DatasetError, Domain, DomainDataset
from fedshift.data.formats.images import IMAGE_SUFFIXES, image_files, read_image

if TYPE_CHECKING:  # torch loads only when data is read, not to list or describe it
    pass


_LAYOUT = "ROOT/<domain>/<class>/<image>"


def _subdirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def _split_indices(
    y: np.ndarray, val_fraction: float, test_fraction: float, seed: int
) -> dict[str, np.ndarray]:
    from sklearn.model_selection import train_test_split

    def split(idx: np.ndarray, frac: float) -> tuple[np.ndarray, np.ndarray]:
        if frac <= 0 or len(idx) < 2:
            return idx, idx[:0]
        try:
            return tuple(train_test_split(idx, test_size=frac, stratify=y[idx], random_state=seed))
        except ValueError:  # a class too small to stratify: fall back to a plain random split
            return tuple(train_test_split(idx, test_size=frac, random_state=seed))

    idx = np.arange(len(y))
    trval, test = split(idx, test_fraction)
    train, val = split(trval, val_fraction / (1.0 - test_fraction))
    return {"train": np.sort(train), "val": np.sort(val), "test": np.sort(test)}


def load_folder_dataset(
    root: str | os.PathLike,
    *,
    image_size: int = 64,
    val_fraction: float = 0.1,
    test_fraction: float = 0.2,
    seed: int = 0,
) -> DomainDataset:
    """Load ``ROOT/<domain>/<class>/<image>`` into memory as a :class:`DomainDataset`.

    Classes are the sorted union of the class folder names over all domains; a domain that
    lacks a class gets a warning. Each domain is split train/val/test (stratified by class when
    possible) with ``seed``. Images are converted to RGB and resized to ``image_size``.
    """
    import torch

    from fedshift.core.split import Split

    root_path = Path(root).expanduser()
    if not root_path.exists():
        raise DatasetError(f"dataset folder {root_path} does not exist (expected layout {_LAYOUT})")
    if not root_path.is_dir():
        raise DatasetError(f"dataset path {root_path} is not a directory (expected {_LAYOUT})")
    if int(image_size) < 1:
        raise DatasetError(f"image_size must be a positive integer, got {image_size}")
    if not (0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1):
        raise DatasetError(
            "val_fraction and test_fraction must be in [0, 1) with a sum below 1, got "
            f"{val_fraction} and {test_fraction}"
        )
    image_size = int(image_size)

    domain_dirs = _subdirs(root_path)
    if not domain_dirs:
        raise DatasetError(f"no domain folders in {root_path} (expected layout {_LAYOUT})")

    files: dict[str, dict[str, list[Path]]] = {}
    for ddir in domain_dirs:
        class_dirs = _subdirs(ddir)
        if not class_dirs:
            raise DatasetError(f"domain folder {ddir} has no class folders (expected {_LAYOUT})")
        per_class: dict[str, list[Path]] = {}
        for cdir in class_dirs:
            imgs = image_files(cdir)
            if not imgs:
                exts = ", ".join(sorted(IMAGE_SUFFIXES))
                raise DatasetError(f"class folder {cdir} contains no image files ({exts})")
            per_class[cdir.name] = imgs
        files[ddir.name] = per_class

    classes = sorted(set().union(*(set(pc) for pc in files.values())))
    class_to_idx = {c: i for i, c in enumerate(classes)}
    missing_meta: dict[str, list[str]] = {}
    for dname, per_class in files.items():
        missing = [c for c in classes if c not in per_class]
        if missing:
            missing_meta[dname] = missing
            warnings.warn(
                f"domain {dname!r} in {root_path} has no folder for class(es) {', '.join(missing)}",
                UserWarning,
                stacklevel=2,
            )

    workers = max(1, min(8, os.cpu_count() or 1))
    domains: dict[str, Domain] = {}
    counts: dict[str, dict[str, int]] = {}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for dname, per_class in files.items():
            paths = [p for c in sorted(per_class) for p in per_class[c]]
            y = np.asarray(
                [class_to_idx[c] for c in sorted(per_class) for _ in per_class[c]], dtype=np.int64
            )
            x = np.stack(list(pool.map(lambda p: read_image(p, image_size), paths)))
            parts = _split_indices(y, val_fraction, test_fraction, seed)
            splits = {
                name: Split(x=torch.from_numpy(x[idx]), y=torch.from_numpy(y[idx]))
                for name, idx in parts.items()
            }
            domains[dname] = Domain(name=dname, **splits)
            counts[dname] = {name: int(len(idx)) for name, idx in parts.items()}

    return DomainDataset(
        name=root_path.name or str(root_path),
        domains=domains,
        classes=classes,
        channels=3,
        image_size=image_size,
        meta={
            "source": "folder",
            "root": str(root_path.resolve()),
            "layout": _LAYOUT,
            "seed": int(seed),
            "val_fraction": float(val_fraction),
            "test_fraction": float(test_fraction),
            "counts": counts,
            "missing_classes": missing_meta,
        },
    )
