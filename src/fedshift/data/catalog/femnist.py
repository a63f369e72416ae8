"""FEMNIST of LEAF (Caldas et al., 2018): handwritten digits and letters (EMNIST's 62
classes) grouped by writer, read in LEAF's release layout; each writer is a domain, so the
partition "one client per domain" gives one client per writer, as in LEAF.

Layout: ``ROOT/train/*.json`` and ``ROOT/test/*.json``, each ``{"users": [...],
"num_samples": [...], "user_data": {user: {"x": [[784 floats in 0..1]], "y": [labels
0..61]}}}``: 28x28 grayscale images, row by row; labels 0..9 digits, 10..35 ``A``..``Z``,
36..61 ``a``..``z``. Files are read with :func:`json.load` only and refused above 1 GiB.

Split: a writer's samples in the train files are its train split (a seeded stratified 0.2
of them, ``split_seed``, is val); its samples in the test files are its test split (LEAF's
per-writer split). Pixels become uint8 ``round(255 * x)``.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedshift.core.errors import did_you_mean
from fedshift.data.catalog.base import (
    CatalogDataset,
    Counts,
    LoadOptions,
    domain_holdout,
    holdout_counts,
    listed_domains,
    pooled_domain,
)
from fedshift.data.domains import DatasetError, DomainDataset
from fedshift.data.formats.images import resize_uint8
from fedshift.data.formats.jsonfile import read_json
from fedshift.data.lists import VAL_FRACTION

if TYPE_CHECKING:  # torch loads only when data is read, not to list or describe it
    pass


SIDE = 28
CLASSES = tuple(string.digits + string.ascii_uppercase + string.ascii_lowercase)
#: LEAF's full FEMNIST: writers and samples
OFFICIAL_WRITERS, OFFICIAL_SAMPLES = 3597, 805_263
LAYOUT = (
    'ROOT/train/*.json and ROOT/test/*.json, each {"users": [...], "num_samples": [...], '
    '"user_data": {user: {"x": [[784 floats 0..1]], "y": [labels 0..61]}}}'
)

Samples = tuple[np.ndarray, np.ndarray]  # (uint8 N×1×28×28, int64 labels)


def _writer_samples(path: Path, user: str, data: object, count: int) -> Samples:
    """A writer's images and labels from one file, every value checked."""
    where = f"{path}: user {user!r}"
    if not isinstance(data, dict) or "x" not in data or "y" not in data:
        raise DatasetError(f"{where} has no 'x' and 'y' lists")
    try:
        x = np.asarray(data["x"], dtype=np.float64)
        y = np.asarray(data["y"])
    except (TypeError, ValueError):
        raise DatasetError(f"{where}: 'x' is not a list of 784-number rows") from None
    if x.ndim != 2 or x.shape[1] != SIDE * SIDE or y.ndim != 1 or len(y) != len(x):
        raise DatasetError(
            f"{where}: x has shape {x.shape} and y {y.shape}, expected N×784 and N labels"
        )
    if len(y) != count:
        raise DatasetError(f"{where}: num_samples says {count}, the data holds {len(y)}")
    if len(y) and (y.dtype.kind not in "iu" or y.min() < 0 or y.max() >= len(CLASSES)):
        raise DatasetError(f"{where}: labels must be integers 0..{len(CLASSES) - 1}")
    if len(x) and not (np.isfinite(x).all() and x.min() >= 0.0 and x.max() <= 1.0):
        raise DatasetError(f"{where}: pixel values outside 0..1")
    pixels = np.rint(x * 255.0).astype(np.uint8).reshape(-1, 1, SIDE, SIDE)
    return pixels, y.astype(np.int64)


def _read_part(root: Path, part: str) -> dict[str, Samples]:
    """Writer -> samples of ``ROOT/<part>/*.json``; a writer listed twice raises."""
    folder = root / part
    if not folder.is_dir():
        raise DatasetError(f"missing folder {folder} (expected {LAYOUT})")
    files = sorted(p for p in folder.glob("*.json") if not p.name.startswith("."))
    if not files:
        raise DatasetError(f"no .json file in {folder} (expected {LAYOUT})")
    out: dict[str, Samples] = {}
    for path in files:
        content = read_json(path)
        if not isinstance(content, dict) or not all(
            k in content for k in ("users", "num_samples", "user_data")
        ):
            raise DatasetError(f"{path} lacks 'users', 'num_samples' or 'user_data'")
        users, counts, data = content["users"], content["num_samples"], content["user_data"]
        if not isinstance(users, list) or not isinstance(counts, list) or len(users) != len(counts):
            raise DatasetError(f"{path}: 'users' and 'num_samples' are not lists of one length")
        if not isinstance(data, dict):
            raise DatasetError(f"{path}: 'user_data' is not an object")
        for user, count in zip(users, counts, strict=True):
            user = str(user)
            if user in out:
                raise DatasetError(f"{path}: user {user!r} is listed twice in {part}/")
            if user not in data:
                raise DatasetError(f"{path}: user {user!r} has no entry in 'user_data'")
            if not isinstance(count, int):
                raise DatasetError(f"{path}: num_samples of user {user!r} is not an integer")
            out[user] = _writer_samples(path, user, data[user], count)
    return out


def _empty() -> Samples:
    return np.zeros((0, 1, SIDE, SIDE), dtype=np.uint8), np.zeros(0, dtype=np.int64)


def read_writers(root: Path) -> dict[str, dict[str, Samples]]:
    """Writer -> {"train", "test"} samples, writers sorted by name; a writer with no train
    sample raises (it could not take part in training)."""
    train, test = _read_part(root, "train"), _read_part(root, "test")
    stray = sorted(set(test) - set(train))
    if stray:
        raise DatasetError(f"writer {stray[0]!r} is in {root / 'test'} but not in the train files")
    out = {}
    for writer in sorted(train):
        if not len(train[writer][1]):
            raise DatasetError(f"writer {writer!r} has no train sample in {root / 'train'}")
        out[writer] = {"train": train[writer], "test": test.get(writer, _empty())}
    return out


@dataclass(frozen=True, kw_only=True)
class FemnistDataset(CatalogDataset):
    """LEAF's FEMNIST with its writers as domains (found in the copy, not on the card)."""

    own_split: str = "LEAF's train/test files are its split"

    def pick_domains(self, names: Sequence[str] | None) -> tuple[str, ...]:
        """() for every writer of the copy, else the listed writers (checked against the
        copy once its files are read: LEAF's files hold many writers each, so every file
        is read either way)."""
        return () if names is None else listed_domains(self.name, names, ())

    def writers(self, found: dict[str, dict[str, Samples]], domains: Sequence[str]) -> list[str]:
        """The writers of ``domains`` (all found for ``()``); one not in the copy raises."""
        for writer in domains:
            if writer not in found:
                raise DatasetError(
                    f"unknown writer {writer!r} of {self.name}{did_you_mean(writer, found)}; "
                    f"the copy has {len(found)} writers"
                )
        return list(domains) if domains else list(found)

    def count(self, root: Path, domains: tuple[str, ...]) -> tuple[Counts, list[str]]:
        """Per-writer split sizes of ``domains`` (every writer for ``()``); the whole copy
        is compared with LEAF's writer and sample totals only when every writer is used."""
        writers = read_writers(root)
        counts = {}
        for writer in self.writers(writers, domains):
            parts = writers[writer]
            labels = parts["train"][1]
            sizes = np.bincount(labels, minlength=len(CLASSES))
            counts[writer] = {
                **holdout_counts([int(n) for n in sizes if n]),
                "test": len(parts["test"][1]),
            }
        samples = sum(len(p["train"][1]) + len(p["test"][1]) for p in writers.values())
        warnings_ = []
        if not domains and (len(writers), samples) != (OFFICIAL_WRITERS, OFFICIAL_SAMPLES):
            warnings_.append(
                f"{self.name}: {len(writers)} writers, {samples} samples; LEAF's full set has "
                f"{OFFICIAL_WRITERS} writers, {OFFICIAL_SAMPLES} samples"
            )
        return counts, warnings_

    def read(self, root: Path, options: LoadOptions) -> DomainDataset:
        import torch

        from fedshift.core.split import Split

        size, seed = self.size(options), options.seed
        found = read_writers(root)
        out, counts = {}, {}
        for writer in self.writers(found, options.domains or ()):
            parts = found[writer]
            x, y = parts["train"]
            kept, held = domain_holdout(list(enumerate(y.tolist())), seed, writer)
            order = np.asarray([i for i, _ in kept] + [i for i, _ in held], dtype=np.int64)
            pool = torch.from_numpy(np.ascontiguousarray(x[order]))
            test_x = torch.from_numpy(parts["test"][0])
            if size != SIDE:
                pool, test_x = resize_uint8(pool, size), resize_uint8(test_x, size)
            test = Split(x=test_x, y=torch.from_numpy(parts["test"][1]))
            out[writer] = pooled_domain(writer, pool, torch.from_numpy(y[order]), len(kept), test)
            counts[writer] = {"train": len(kept), "val": len(held), "test": len(test)}
        classes = list(CLASSES)
        return DomainDataset(
            name=self.name,
            domains=out,
            classes=classes,
            channels=1,
            image_size=size,
            meta={
                **self.meta(root, options),
                "split": (
                    f"LEAF per-writer train/test files; val: a seeded stratified "
                    f"{VAL_FRACTION:g} of each writer's train samples (split_seed={seed})"
                ),
                "augment": self.augment,
                "classes": classes,
                "counts": counts,
            },
        )

    def domain_line(self) -> str:
        return "the writers of the copy (one domain each)"


FEMNIST = FemnistDataset(
    name="femnist",
    source="FEMNIST of LEAF (Caldas et al., 2018), EMNIST by writer",
    layout=LAYOUT,
    split=(
        "writers as domains; LEAF's per-writer train/test files (val: a seeded stratified "
        "0.2 of each writer's train samples)"
    ),
    domains=(),
    resolution=SIDE,
    classes=CLASSES,
    description="28 px handwritten digits and letters (62 classes), each writer a domain",
    class_source="LEAF's labels 0..61: digits, then upper-case, then lower-case letters",
)
