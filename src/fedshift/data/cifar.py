"""CIFAR-10 / CIFAR-100 read from their binary release with numpy (nothing is unpickled).

A CIFAR-10 record is 3,073 bytes: the label, then 3,072 pixel bytes (the 32x32 red plane,
then green, then blue); a CIFAR-100 record is 3,074 bytes: coarse label, fine label, pixels.
Each dataset is one domain named like it, with the official train and test files; the val
split is a seeded stratified holdout of the train file (the catalog's ``VAL_FRACTION``).
CIFAR-100 uses the fine labels, named by ``fine_label_names.txt`` when the copy has it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fedshift.data.domains import DatasetError, Domain, DomainDataset, Split

NATIVE_SIZE = 32
PIXELS = 3 * NATIVE_SIZE * NATIVE_SIZE
CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)


@dataclass(frozen=True)
class BinaryLayout:
    """Where one CIFAR release keeps its records and how a record is laid out."""

    folder: str
    train: tuple[str, ...]
    test: tuple[str, ...]
    label_bytes: int  # bytes before the pixels; the last of them is the label used
    num_classes: int
    names_file: str  # the class names, one a line, in label order

    @property
    def record(self) -> int:
        return self.label_bytes + PIXELS


LAYOUTS = {
    "cifar10": BinaryLayout(
        "cifar-10-batches-bin",
        tuple(f"data_batch_{i}.bin" for i in range(1, 6)),
        ("test_batch.bin",),
        1,
        10,
        "batches.meta.txt",
    ),
    "cifar100": BinaryLayout(
        "cifar-100-binary", ("train.bin",), ("test.bin",), 2, 100, "fine_label_names.txt"
    ),
}


def read_records(path: Path, layout: BinaryLayout) -> tuple[np.ndarray, np.ndarray]:
    """(pixels N x 3 x 32 x 32 uint8, labels N int64) of one binary file."""
    if not path.is_file():
        expected = ", ".join(layout.train + layout.test)
        raise DatasetError(f"missing file {path} (expected {layout.folder}/ with {expected})")
    raw = np.fromfile(path, dtype=np.uint8)
    if raw.size == 0 or raw.size % layout.record:
        raise DatasetError(
            f"{path} is {raw.size} bytes, not a whole number of {layout.record}-byte records "
            "(truncated or not the binary release)"
        )
    records = raw.reshape(-1, layout.record)
    labels = records[:, layout.label_bytes - 1].astype(np.int64)
    if labels.max() >= layout.num_classes:
        raise DatasetError(
            f"{path} has label {int(labels.max())}; {layout.num_classes} classes expected"
        )
    pixels = records[:, layout.label_bytes :].reshape(-1, 3, NATIVE_SIZE, NATIVE_SIZE)
    return pixels, labels


def _read_split(folder: Path, names: Sequence[str], layout: BinaryLayout):
    parts = [read_records(folder / name, layout) for name in names]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate([p for p, _ in parts]), np.concatenate([y for _, y in parts])


def class_names(folder: Path, layout: BinaryLayout, official: Sequence[str]) -> list[str]:
    """The official names (CIFAR-10), else the release's names file, else ``class_NN``."""
    if official:
        return list(official)
    path = folder / layout.names_file
    if path.is_file():
        names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
        names = [n for n in names if n]
        if len(names) == layout.num_classes:
            return names
        warnings.warn(
            f"fedshift: {path} lists {len(names)} names, not {layout.num_classes}; "
            "classes are named by index",
            RuntimeWarning,
            stacklevel=3,
        )
    width = len(str(layout.num_classes - 1))
    return [f"class_{i:0{width}d}" for i in range(layout.num_classes)]


def resize_uint8(pixels: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 images resized (bilinear, antialiased) in chunks, so no float copy of all."""
    out = torch.empty((len(pixels), 3, size, size), dtype=torch.uint8)
    for start in range(0, len(pixels), 4096):
        chunk = pixels[start : start + 4096].float()
        resized = torch.nn.functional.interpolate(
            chunk, size=(size, size), mode="bilinear", align_corners=False, antialias=True
        )
        out[start : start + 4096] = resized.round().clamp(0, 255).to(torch.uint8)
    return out


def load_cifar(
    name: str,
    root: Path,
    *,
    image_size: int,
    seed: int,
    holdout: Callable[[list, str], tuple[list, list]],
    val_fraction: float,
    meta: dict,
) -> DomainDataset:
    """CIFAR-10 or -100 from ``root/<release folder>`` as one domain named ``name``.

    ``holdout(entries, name)`` splits ``(row, label)`` entries into (train, val) as the other
    catalog datasets do (seeded per domain); train rows come first in the domain's array, so
    train and val are views of it."""
    layout = LAYOUTS[name]
    folder = root / layout.folder
    if not folder.is_dir():
        raise DatasetError(f"missing folder {folder} (expected {meta['layout']})")
    train_x, train_y = _read_split(folder, layout.train, layout)
    test_x, test_y = _read_split(folder, layout.test, layout)
    kept, held = holdout(list(enumerate(train_y.tolist())), name)
    order = np.asarray([i for i, _ in kept] + [i for i, _ in held], dtype=np.int64)
    pool_x = torch.from_numpy(train_x[order])
    pool_y = torch.from_numpy(train_y[order])
    test_images = torch.from_numpy(np.ascontiguousarray(test_x))
    if image_size != NATIVE_SIZE:
        pool_x = resize_uint8(pool_x, image_size)
        test_images = resize_uint8(test_images, image_size)
    cut = len(kept)
    domain = Domain(
        name=name,
        train=Split(x=pool_x[:cut], y=pool_y[:cut]),
        val=Split(x=pool_x[cut:], y=pool_y[cut:]),
        test=Split(x=test_images, y=torch.from_numpy(test_y)),
    )
    classes = class_names(folder, layout, CIFAR10_CLASSES if name == "cifar10" else ())
    counts = {name: {"train": cut, "val": len(held), "test": len(test_y)}}
    description = (
        f"official train/test files; val: a seeded stratified {val_fraction:g} of the train "
        f"file (split_seed={seed}); {'fine labels' if name == 'cifar100' else 'labels'}"
    )
    return DomainDataset(
        name=name,
        domains={name: domain},
        classes=classes,
        channels=3,
        image_size=int(image_size),
        meta={
            **meta,
            "split": description,
            "augment": "none",
            "classes": classes,
            "counts": counts,
        },
    )
