"""CIFAR-10 / CIFAR-100 read from their binary release with numpy (nothing is unpickled).

A CIFAR-10 record is 3,073 bytes: the label, then 3,072 pixel bytes (the 32x32 red plane,
then green, then blue); a CIFAR-100 record is 3,074 bytes: coarse label, fine label, pixels.
Each dataset is one domain named like it, with the official train and test files; the val
split is a seeded stratified holdout of the train file (the catalog's ``VAL_FRACTION``).
CIFAR-100 uses the fine labels, named by ``fine_label_names.txt`` when the copy has it.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedshift.core.bounded import open_text
from fedshift.data.catalog.base import (
    CatalogDataset,
    Counts,
    LoadOptions,
    domain_holdout,
    pooled_domain,
)
from fedshift.data.domains import DatasetError, DomainDataset
from fedshift.data.formats.images import resize_uint8
from fedshift.data.lists import VAL_FRACTION

if TYPE_CHECKING:  # torch loads only when data is read, not to list or describe it
    pass


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
        with open_text(path, DatasetError, "class names file") as handle:
            names = [line.strip() for line in handle.read().splitlines()]
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


@dataclass(frozen=True, kw_only=True)
class CifarDataset(CatalogDataset):
    """A CIFAR binary release as one domain named like the dataset."""

    release: BinaryLayout
    official_classes: tuple[str, ...] = ()  # empty: the release's names file
    label_kind: str = "labels"
    resolution: int = NATIVE_SIZE
    own_split: str = "it has official files"

    def count(self, root: Path, domains: tuple[str, ...]) -> tuple[Counts, list[str]]:
        """Records per split from the files' sizes (a size not a whole number of records
        raises); the total is compared with the official count. One domain: ``domains``
        can only name it."""
        folder = root / self.release.folder
        counts = {}
        for split, names in (("train", self.release.train), ("test", self.release.test)):
            total = 0
            for name in names:
                path = folder / name
                if not path.is_file():
                    raise DatasetError(f"missing file {path} ({self.layout})")
                size = path.stat().st_size
                if size % self.release.record:
                    raise DatasetError(
                        f"{path} is not a whole number of {self.release.record}-byte records"
                    )
                total += size // self.release.record
            counts[split] = total
        domain = self.domains[0]
        warnings_ = self.total_warnings({domain: counts["train"] + counts["test"]})
        return {domain: counts}, warnings_

    def read(self, root: Path, options: LoadOptions) -> DomainDataset:
        """The official train and test files; val is the seeded per-domain holdout of the
        train file (train rows first, so train and val are views of one array)."""
        import torch

        from fedshift.core.split import Split

        name, layout, seed = self.name, self.release, options.seed
        size = self.size(options)
        folder = root / layout.folder
        if not folder.is_dir():
            raise DatasetError(f"missing folder {folder} (expected {self.layout})")
        train_x, train_y = _read_split(folder, layout.train, layout)
        test_x, test_y = _read_split(folder, layout.test, layout)
        kept, held = domain_holdout(list(enumerate(train_y.tolist())), seed, name)
        order = np.asarray([i for i, _ in kept] + [i for i, _ in held], dtype=np.int64)
        pool_x = torch.from_numpy(train_x[order])
        pool_y = torch.from_numpy(train_y[order])
        test_images = torch.from_numpy(np.ascontiguousarray(test_x))
        if size != NATIVE_SIZE:
            pool_x = resize_uint8(pool_x, size)
            test_images = resize_uint8(test_images, size)
        test = Split(x=test_images, y=torch.from_numpy(test_y))
        domain = pooled_domain(name, pool_x, pool_y, len(kept), test)
        classes = class_names(folder, layout, self.official_classes)
        counts = {name: {"train": len(kept), "val": len(held), "test": len(test_y)}}
        description = (
            f"official train/test files; val: a seeded stratified {VAL_FRACTION:g} of the "
            f"train file (split_seed={seed}); {self.label_kind}"
        )
        return DomainDataset(
            name=name,
            domains={name: domain},
            classes=classes,
            channels=3,
            image_size=size,
            meta={
                **self.meta(root, options),
                "split": description,
                "augment": self.augment,
                "classes": classes,
                "counts": counts,
            },
        )


CIFAR10 = CifarDataset(
    name="cifar10",
    source="CIFAR-10 binary version (Krizhevsky 2009)",
    layout="ROOT/cifar-10-batches-bin/data_batch_{1..5}.bin, test_batch.bin (3073-byte records)",
    split="official train/test files (val: a seeded stratified 0.2 of the train files)",
    domains=("cifar10",),
    official_totals={"cifar10": 60000},
    release=LAYOUTS["cifar10"],
    official_classes=CIFAR10_CLASSES,
    description="10 object classes, one domain (label-skew experiments)",
    class_source=f"the release's label order: {', '.join(CIFAR10_CLASSES)}",
)
CIFAR100 = CifarDataset(
    name="cifar100",
    source="CIFAR-100 binary version (Krizhevsky 2009)",
    layout="ROOT/cifar-100-binary/train.bin, test.bin (3074-byte records)",
    split="official train/test files, fine labels (val: a seeded stratified 0.2 of train.bin)",
    domains=("cifar100",),
    official_totals={"cifar100": 60000},
    release=LAYOUTS["cifar100"],
    label_kind="fine labels",
    description="100 object classes (fine labels), one domain (label-skew experiments)",
    class_source=(
        "the release's fine_label_names.txt in label order, class_00..class_99 without it"
    ),
)
