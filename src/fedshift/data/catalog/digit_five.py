"""Digit-Five (MNIST, MNIST-M, SVHN, USPS, SynDigits) read from the files each domain's public
copy ships, with the KD3A / FACT protocol: a seeded 25,000 of each train file, the first 9,000
of each test file (USPS: all of both).

Layout under ROOT (nothing is unpickled; ``.mat`` files are MATLAB v5, read by scipy):

* ``mnist/``: the MNIST idx files ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
  ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte`` (each may be ``.gz``); 28x28 gray.
* ``mnistm/``: Ganin's MNIST-M release, ``mnist_m_train/`` + ``mnist_m_train_labels.txt`` and
  ``mnist_m_test/`` + ``mnist_m_test_labels.txt`` (lines ``<file> <label>``), optionally
  inside ``mnistm/mnist_m/``; 28x28 RGB PNGs, decoded through the catalog's image cache.
* ``svhn/``: SVHN format 2, ``train_32x32.mat`` / ``test_32x32.mat`` (``X`` 32x32x3xN uint8,
  ``y`` Nx1 with 10 meaning digit 0).
* ``usps/``: the LIBSVM copy ``usps.bz2`` / ``usps.t.bz2`` (or decompressed ``usps`` /
  ``usps.t``): ``<label> <index>:<value> ...`` with 256 values in [-1, 1] (16x16 gray) and
  labels 1..10 meaning digits 0..9 (torchvision's USPS reads the same files).
* ``syn/``: SynDigits as ``synth_train_32x32.mat`` / ``synth_test_32x32.mat`` (SVHN's ``X``
  / ``y`` layout), or M3SDA's ``syn_number.mat`` (``train_data`` / ``test_data`` Nx32x32x3,
  ``train_label`` / ``test_label``); a label 10 means digit 0.

Where a domain's folder is absent, it is read from M3SDA's Digit-Five bundle, the ``.mat``
files KD3A and FACT read, lying directly in ROOT: ``mnist_data.mat`` (``train_32`` /
``test_32``, one-hot ``label_train`` / ``label_test``), ``mnistm_with_label.mat`` (``train`` /
``test`` Nx28x28x3, one-hot labels), ``svhn_train_32x32.mat`` / ``svhn_test_32x32.mat``,
``syn_number.mat`` (or ``synth_{train,test}_32x32.mat``) and ``usps_28x28.mat`` (a 2x2 cell
``dataset`` of train / test images Nx1x28x28 in [0, 1) and labels: another USPS split,
7,438 / 1,860). Names and shapes follow KD3A's, FACT's and Dassl's loaders.

Every image becomes 32x32 RGB (gray copied to three channels, resized bilinear with
antialiasing where the source is 28 or 16 px). Labels are the digits 0..9.
"""

from __future__ import annotations

import os
import sys
import zlib
from collections.abc import Callable, Sequence
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
from fedshift.data.domains import DatasetError, Domain, DomainDataset
from fedshift.data.formats.idx import find_idx, read_idx
from fedshift.data.formats.images import resize_uint8, verify_images
from fedshift.data.formats.libsvm import read_libsvm
from fedshift.data.formats.mat import mat_load, mat_variables
from fedshift.data.lists import VAL_FRACTION, decode_dataset

if TYPE_CHECKING:  # torch loads only when data is read, not to list or describe it
    import torch


NAME = "digit-five"
DOMAINS = ("mnist", "mnistm", "svhn", "usps", "syn")
CLASSES = tuple(str(d) for d in range(10))
RESOLUTION = 32
#: KD3A / FACT: each domain's train file is sampled down to this many images ...
TRAIN_CAP = 25_000
#: ... and its test split is the first this many images of the test file
TEST_CAP = 9_000
#: the full files of the public copies (train, test)
OFFICIAL = {
    "mnist": {"train": 60_000, "test": 10_000},
    "mnistm": {"train": 59_001, "test": 9_001},
    "svhn": {"train": 73_257, "test": 26_032},
    "usps": {"train": 7_291, "test": 2_007},
    "syn": {"train": 25_000, "test": 9_000},
}
#: what each domain's folder under ROOT holds
LAYOUTS = {
    "mnist": "ROOT/mnist/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]",
    "mnistm": "ROOT/mnistm/mnist_m_{train,test}/ + mnist_m_{train,test}_labels.txt",
    "svhn": "ROOT/svhn/{train,test}_32x32.mat",
    "usps": "ROOT/usps/usps.bz2, usps.t.bz2 (LIBSVM; or decompressed)",
    "syn": "ROOT/syn/synth_{train,test}_32x32.mat or syn_number.mat",
}
LAYOUT = "; ".join(LAYOUTS.values()) + "; or M3SDA's Digit-Five .mat files in ROOT"
SPLIT = (
    f"KD3A/FACT: a seeded {TRAIN_CAP:,} of each train file (split_seed; USPS: all), of which a "
    f"seeded stratified 0.2 is val; test: the first {TEST_CAP:,} of the test file (USPS: all)"
)

_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_SVHN_FILES = {"train": "train_32x32.mat", "test": "test_32x32.mat"}
_SYN_FILES = {"train": "synth_train_32x32.mat", "test": "synth_test_32x32.mat"}
_SYN_NUMBER = "syn_number.mat"
_USPS_FILES = {"train": "usps", "test": "usps.t"}
_USPS_SIDE = 16
_SPLITS = ("train", "test")
#: M3SDA's Digit-Five bundle, the .mat files KD3A and FACT read, all directly in ROOT; each
#: domain is read from them when its folder is absent
_BUNDLE = {
    "mnist": ("mnist_data.mat",),
    "mnistm": ("mnistm_with_label.mat",),
    "svhn": ("svhn_train_32x32.mat", "svhn_test_32x32.mat"),
    "usps": ("usps_28x28.mat",),
    "syn": (_SYN_NUMBER,),
}
#: the bundle's files: MNIST's and MNIST-M's 55,000 training images (no validation 5,000),
#: and another USPS split (7,438 / 1,860)
OFFICIAL_BUNDLE = {
    **OFFICIAL,
    "mnist": {"train": 55_000, "test": 10_000},
    "mnistm": {"train": 55_000, "test": 10_000},
    "usps": {"train": 7_438, "test": 1_860},
}


def _source(root: Path, domain: str) -> str:
    """``folder`` (ROOT/<domain>/ in the public copy's format) or ``bundle`` (M3SDA's .mat
    files in ROOT); neither is a DatasetError naming both."""
    if (root / domain).is_dir():
        return "folder"
    if all((root / name).is_file() for name in _BUNDLE[domain]) or (
        domain == "syn" and all((root / name).is_file() for name in _SYN_FILES.values())
    ):
        return "bundle"
    raise DatasetError(
        f"missing folder {root / domain} (expected {LAYOUTS[domain]}; or M3SDA's "
        f"{' + '.join(_BUNDLE[domain])} in {root})"
    )


Arrays = tuple[np.ndarray, np.ndarray]  # (uint8 N x C x H x W, int64 labels)


# -- MNIST: idx files ----------------------------------------------------------------------


def _mnist_counts(folder: Path) -> dict[str, int]:
    counts = {}
    for split, (images, labels) in _MNIST_FILES.items():
        image_path, label_path = (
            find_idx(folder, images, LAYOUTS["mnist"]),
            find_idx(folder, labels, LAYOUTS["mnist"]),
        )
        (count, rows, cols), _ = read_idx(image_path, "images", True)
        (label_count,), label_bytes = read_idx(label_path, "labels", False)
        if label_count != count or len(label_bytes) != count:
            raise DatasetError(f"{image_path} has {count} images but {label_path} {label_count}")
        if image_path.suffix != ".gz" and image_path.stat().st_size != 16 + count * rows * cols:
            raise DatasetError(f"{image_path} is truncated ({count} images of {rows}x{cols})")
        _digits(np.frombuffer(label_bytes, dtype=np.uint8), label_path, 0)
        counts[split] = count
    return counts


def _mnist_split(folder: Path, split: str) -> Arrays:
    images, labels = _MNIST_FILES[split]
    image_path, label_path = (
        find_idx(folder, images, LAYOUTS["mnist"]),
        find_idx(folder, labels, LAYOUTS["mnist"]),
    )
    (count, rows, cols), pixels = read_idx(image_path, "images", False)
    (label_count,), label_bytes = read_idx(label_path, "labels", False)
    if len(pixels) != count * rows * cols or len(label_bytes) != label_count:
        raise DatasetError(f"{image_path} or {label_path} is truncated")
    if label_count != count:
        raise DatasetError(f"{image_path} has {count} images but {label_path} {label_count}")
    x = np.frombuffer(pixels, dtype=np.uint8).reshape(count, 1, rows, cols)
    return x, _digits(np.frombuffer(label_bytes, dtype=np.uint8), label_path, 0)


# -- MNIST-M: PNG folders and label lists ----------------------------------------------------


def _mnistm_folder(root: Path) -> Path:
    folder = root / "mnistm"
    nested = folder / "mnist_m"
    return nested if nested.is_dir() else folder


def _mnistm_list(folder: Path, split: str) -> list[tuple[str, int]]:
    """(file name, digit) per line of a split's label list; every file must exist."""
    images, listing = folder / f"mnist_m_{split}", folder / f"mnist_m_{split}_labels.txt"
    for path, what in ((listing, "label list"), (images, "image folder")):
        if not path.exists():
            raise DatasetError(f"missing MNIST-M {what} {path} (expected {LAYOUTS['mnistm']})")
    entries = []
    with open_text(listing, DatasetError, "label list", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2 or not parts[1].isdigit():
                raise DatasetError(f"{listing.name} line {number}: expected '<file> <label>'")
            if int(parts[1]) > 9:
                raise DatasetError(f"{listing.name} line {number}: label {parts[1]} not in 0..9")
            entries.append((parts[0], int(parts[1])))
    present = set(os.listdir(images))
    missing = next((name for name, _ in entries if name not in present), None)
    if missing is not None:
        raise DatasetError(f"{listing.name} names a missing file {images / missing}")
    return entries


# -- SVHN and SynDigits: MATLAB v5 files -----------------------------------------------------


def _syn_files(folder: Path) -> tuple[dict[str, Path], bool]:
    """(split -> file, whether it is M3SDA's one-file syn_number.mat)."""
    split_files = {s: folder / n for s, n in _SYN_FILES.items()}
    if all(p.is_file() for p in split_files.values()) or not (folder / _SYN_NUMBER).is_file():
        return split_files, False
    return {s: folder / _SYN_NUMBER for s in _SYN_FILES}, True


#: how a .mat file stores its images: SVHN's X (32 x 32 x 3 x N), N x S x S x 3 (S 32, or 28
#: in M3SDA's mnistm_with_label.mat), or gray N x 32 x 32 / N x 1024 (its mnist_data.mat)
_ORDERS = {"HWCN": "32 x 32 x 3 x N", "NHWC": "N x S x S x 3", "NGRAY": "N x 32 x 32"}


def _mat_layout(domain: str, root: Path) -> dict[str, tuple[Path, str, str, str]]:
    """split -> (file, image variable, label variable, image order) of a .mat domain."""
    bundle = _source(root, domain) == "bundle"
    if domain == "svhn":
        names = {s: f"svhn_{n}" for s, n in _SVHN_FILES.items()} if bundle else _SVHN_FILES
        folder = root if bundle else root / "svhn"
        return {s: (folder / n, "X", "y", "HWCN") for s, n in names.items()}
    if domain == "mnist":
        return {s: (root / _BUNDLE["mnist"][0], f"{s}_32", f"label_{s}", "NGRAY") for s in _SPLITS}
    if domain == "mnistm":
        return {s: (root / _BUNDLE["mnistm"][0], s, f"label_{s}", "NHWC") for s in _SPLITS}
    files, number = _syn_files(root if bundle else root / "syn")
    if number:
        return {s: (p, f"{s}_data", f"{s}_label", "NHWC") for s, p in files.items()}
    return {s: (p, "X", "y", "HWCN") for s, p in files.items()}


def _mat_labels(labels: np.ndarray, count: int, path: Path, name: str) -> np.ndarray:
    """Digits from a label variable: one per image, or one-hot rows (M3SDA's files)."""
    if labels.ndim == 2 and labels.shape == (count, 10) and count != 1:
        if not np.array_equal(labels.sum(axis=1), np.ones(count)):
            raise DatasetError(f"{path}: {name} is {count} x 10 but not one-hot")
        return labels.argmax(axis=1).astype(np.int64)
    if labels.size != count:
        raise DatasetError(f"{path}: {count} images but {name} has shape {labels.shape}")
    return _digits(labels.reshape(-1), path, 10)


def _mat_count(path: Path, image_var: str, label_var: str, order: str) -> int:
    known = LAYOUTS.get(path.parent.name, LAYOUT)
    shapes = mat_variables(path, known)
    for name in (image_var, label_var):
        if name not in shapes:
            expected = f"{image_var}, {label_var}"
            raise DatasetError(f"{path} has no variable {name!r} (expected {expected})")
    shape = shapes[image_var]
    count = shape[3] if order == "HWCN" and len(shape) == 4 else shape[0]
    fits = {
        "HWCN": len(shape) == 4 and shape[:3] == (32, 32, 3),
        "NHWC": len(shape) == 4 and shape[3] == 3 and shape[1] == shape[2] in (28, 32),
        "NGRAY": len(shape) >= 2 and int(np.prod(shape[1:])) == 32 * 32,
    }[order]
    if not fits:
        raise DatasetError(f"{path}: {image_var} has shape {shape}, expected {_ORDERS[order]}")
    _mat_labels(mat_load(path, (label_var,))[label_var], count, path, label_var)
    return count


def _mat_split(path: Path, image_var: str, label_var: str, order: str) -> Arrays:
    count = _mat_count(path, image_var, label_var, order)
    found = mat_load(path, (image_var, label_var))
    x = found[image_var]
    if order == "HWCN":
        x = x.transpose(3, 2, 0, 1)
    elif order == "NHWC":
        x = x.transpose(0, 3, 1, 2)
    else:
        x = x.reshape(count, 1, 32, 32)
    return _as_uint8(x), _mat_labels(found[label_var], count, path, label_var)


def _as_uint8(x: np.ndarray) -> np.ndarray:
    if x.dtype == np.uint8:
        return x
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def _usps_mat(path: Path) -> dict[str, Arrays]:
    """M3SDA's usps_28x28.mat: a 2 x 2 cell ``dataset`` of (images N x 1 x 28 x 28 in [0, 1],
    labels) for train, then test."""
    cell = mat_load(path, ("dataset",))["dataset"]
    if cell.dtype != object or cell.shape != (2, 2):
        raise DatasetError(f"{path}: dataset is not a 2 x 2 cell of (images, labels)")
    out = {}
    for row, split in enumerate(_SPLITS):
        images, labels = np.asarray(cell[row, 0]), np.asarray(cell[row, 1])
        if images.ndim != 4 or images.shape[1:] != (1, 28, 28):
            raise DatasetError(
                f"{path}: {split} images have shape {images.shape}, expected N x 1 x 28 x 28"
            )
        digits = _mat_labels(labels, images.shape[0], path, f"{split} labels")
        if images.size and images.max() <= 1.0:  # [0, 1): truncated to 0..254 as KD3A does
            images = np.floor(images * 255.0)
        out[split] = (_as_uint8(images), digits)
    return out


# -- USPS: LIBSVM text -------------------------------------------------------------------


def _usps_path(folder: Path, split: str) -> Path:
    name = _USPS_FILES[split]
    for candidate in (folder / f"{name}.bz2", folder / name):
        if candidate.is_file():
            return candidate
    raise DatasetError(f"missing file {folder / name}.bz2 (expected {LAYOUTS['usps']})")


def _usps_split(folder: Path, split: str) -> Arrays:
    """A USPS file's 16x16 gray images and digits (LIBSVM labels 1..10 are digits 0..9,
    values in [-1, 1] become 0..255); a malformed line raises DatasetError."""
    values, labels = read_libsvm(_usps_path(folder, split), _USPS_SIDE * _USPS_SIDE, range(1, 11))
    pixels = np.clip(np.rint((values + 1.0) * 127.5), 0, 255).astype(np.uint8)
    return pixels.reshape(-1, 1, _USPS_SIDE, _USPS_SIDE), labels - 1


# -- shared ----------------------------------------------------------------------------------


def _digits(labels: np.ndarray, path: Path, zero_as: int) -> np.ndarray:
    """Labels as digits 0..9; ``zero_as`` (10 for SVHN / SynDigits) also means 0."""
    labels = labels.astype(np.int64)
    if zero_as:
        labels = np.where(labels == zero_as, 0, labels)
    bad = labels[(labels < 0) | (labels > 9)]
    if bad.size:
        allowed = "0..10" if zero_as else "0..9"
        raise DatasetError(f"{path} has label {int(bad[0])}; digits {allowed} expected")
    return labels


def file_counts(
    root: Path, read: dict[str, Arrays] | None = None, domains: Sequence[str] = DOMAINS
) -> dict[str, dict[str, int]]:
    """Domain -> split -> images in the full train / test files of ``domains`` (the other
    domains' files need not be there), from the files' headers, label variables and lists
    (every label checked, every listed MNIST-M image present); a missing or malformed file
    raises DatasetError. Pixels are not read but USPS's (small: read whole to be checked),
    which ``read`` keeps for the loader."""
    root = Path(root)
    read = {} if read is None else read
    counts = {}
    for domain in domains:
        source = _source(root, domain)
        if domain == "mnist" and source == "folder":
            counts[domain] = _mnist_counts(root / "mnist")
        elif domain == "mnistm" and source == "folder":
            folder = _mnistm_folder(root)
            counts[domain] = {s: len(_mnistm_list(folder, s)) for s in _SPLITS}
        elif domain == "usps":
            if source == "bundle":
                parsed = _usps_mat(root / _BUNDLE["usps"][0])
            else:
                parsed = {s: _usps_split(root / "usps", s) for s in _SPLITS}
            read.update({f"usps/{s}": arrays for s, arrays in parsed.items()})
            counts[domain] = {s: len(arrays[1]) for s, arrays in parsed.items()}
        else:
            layout = _mat_layout(domain, root)
            counts[domain] = {s: _mat_count(*args) for s, args in layout.items()}
    return counts


def sources(root: Path, domains: Sequence[str] = DOMAINS) -> dict[str, str]:
    """Domain -> ``folder`` or ``bundle``: where each of ``domains`` is read from."""
    return {domain: _source(Path(root), domain) for domain in domains}


def count_warnings(counts: dict[str, dict[str, int]], where: dict[str, str]) -> list[str]:
    """One line per file whose image count differs from the official copy's (``where``:
    each domain's source, as :func:`sources` gives it)."""
    lines = []
    for domain, splits in counts.items():
        official = (OFFICIAL_BUNDLE if where[domain] == "bundle" else OFFICIAL)[domain]
        lines += [
            f"{NAME}/{domain}: {split} file has {found} images, the official copy has "
            f"{official[split]}"
            for split, found in splits.items()
            if found != official[split]
        ]
    return lines


def _sample(count: int, cap: int, seed: int, domain: str) -> np.ndarray:
    """Sorted row numbers of a seeded ``cap`` of ``count`` rows (all when ``count <= cap``)."""
    if count <= cap:
        return np.arange(count)
    rng = np.random.default_rng([int(seed) % 2**32, zlib.crc32(domain.encode())])
    return np.sort(rng.choice(count, size=cap, replace=False))


def _array_domain(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    pool: np.ndarray,
    holdout: Callable[[list, str], tuple[list, list]],
    size: int,
) -> Domain:
    """A domain whose train and val are views of one array (train rows first)."""
    import torch

    from fedshift.core.split import Split

    kept, held = holdout([(int(i), int(y_train[i])) for i in pool], name)
    order = np.asarray([i for i, _ in kept] + [i for i, _ in held], dtype=np.int64)
    test = Split(x=_rgb(x_test, size), y=torch.from_numpy(np.ascontiguousarray(y_test)))
    labels = torch.from_numpy(y_train[order])
    return pooled_domain(name, _rgb(x_train[order], size), labels, len(kept), test)


def _rgb(x: np.ndarray, size: int) -> torch.Tensor:
    import torch

    images = torch.from_numpy(np.require(x, requirements=["C", "W"]))
    if images.shape[1] == 1:
        images = images.expand(-1, 3, -1, -1).contiguous()
    if images.shape[-1] != size or images.shape[-2] != size:
        images = resize_uint8(images, size)
    return images


def _read_arrays(root: Path, domain: str, read: dict[str, Arrays]) -> tuple[Arrays, Arrays]:
    """(train, test) arrays of an array-backed domain (USPS's from ``read``)."""
    if domain == "usps":
        return read.pop("usps/train"), read.pop("usps/test")
    if domain == "mnist" and _source(root, domain) == "folder":
        return _mnist_split(root / "mnist", "train"), _mnist_split(root / "mnist", "test")
    layout = _mat_layout(domain, root)
    return _mat_split(*layout["train"]), _mat_split(*layout["test"])


def load_digit_five(
    root: Path,
    *,
    image_size: int,
    seed: int,
    holdout: Callable[[list, str], tuple[list, list]],
    val_fraction: float,
    meta: dict,
    domains: Sequence[str] | None = None,
    cache_folder: Path | None = None,
    train_cap: int = TRAIN_CAP,
    test_cap: int = TEST_CAP,
) -> DomainDataset:
    """Digit-Five from ``root`` (the layout of the module docstring) at ``image_size`` px.

    Per domain, a seeded ``train_cap`` of the train file (``seed``, the domain's own stream)
    is split by ``holdout(entries, domain)`` into train / val; the test split is the first
    ``test_cap`` images of the test file. Every file is checked first; a count differing from
    the official copy is one ``fedshift: warning:`` line on stderr (as ``datasets check``
    prints it) and in ``meta["count_warnings"]``. Only ``domains`` (default all) are
    checked and read: the other domains' files need not be there.
    MNIST-M's PNGs go through the catalog image cache in ``cache_folder`` (None: decoded
    into memory); the other domains are held in memory."""
    root = Path(root)
    wanted = [d for d in DOMAINS if domains is None or d in domains]
    read: dict[str, Arrays] = {}
    counts = file_counts(root, read, wanted)
    where = sources(root, wanted)
    notes = count_warnings(counts, where)
    for line in notes:
        print(f"fedshift: warning: {line}", file=sys.stderr, flush=True)
    description = (
        f"KD3A/FACT: a seeded {train_cap:,} of each train file (split_seed={seed}; all where "
        f"smaller), val a stratified {val_fraction:g} of them; test: the first {test_cap:,} "
        "of the test file"
        if train_cap < sys.maxsize
        else f"the whole official files (catalog_split=full): val a stratified "
        f"{val_fraction:g} of the train file (split_seed={seed}), test the whole test file"
    )
    out, image_cache, sample = {}, {}, {}
    for domain in wanted:
        pool = _sample(counts[domain]["train"], train_cap, seed, domain)
        test_rows = min(counts[domain]["test"], test_cap)
        sample[domain] = {
            "train_file": counts[domain]["train"],
            "train_used": len(pool),
            "test_file": counts[domain]["test"],
            "test_used": test_rows,
            "files": where[domain],
        }
        if domain == "mnistm" and where[domain] == "folder":
            folder = _mnistm_folder(root)
            train_list = _mnistm_list(folder, "train")
            chosen = [(folder / "mnist_m_train" / train_list[i][0], train_list[i][1]) for i in pool]
            kept, held = holdout(chosen, domain)
            test = _mnistm_list(folder, "test")[:test_rows]
            test = [(folder / "mnist_m_test" / name, digit) for name, digit in test]
            parts = {"train": kept, "val": held, "test": test}
            decoded = decode_dataset(
                NAME,
                {domain: parts},
                CLASSES,
                image_size,
                {**meta, "split": description},
                cache_folder=cache_folder,
            )
            out[domain] = decoded.domains[domain]
            image_cache[domain] = decoded.meta["image_cache"][domain]
            continue
        (x_train, y_train), (x_test, y_test) = _read_arrays(root, domain, read)
        out[domain] = _array_domain(
            domain,
            x_train,
            y_train,
            x_test[:test_rows],
            y_test[:test_rows],
            pool,
            holdout,
            image_size,
        )
        del x_train, x_test  # the whole files: freed before the next domain's are read
        image_cache[domain] = ""
    return DomainDataset(
        name=NAME,
        domains=out,
        classes=list(CLASSES),
        channels=3,
        image_size=int(image_size),
        meta={
            **meta,
            "split": description,
            "augment": "none",
            "classes": list(CLASSES),
            "counts": {
                d: {"train": len(v.train), "val": len(v.val), "test": len(v.test)}
                for d, v in out.items()
            },
            "sample": sample,
            "count_warnings": notes,
            "image_cache": image_cache,
        },
    )


@dataclass(frozen=True, kw_only=True)
class DigitFiveDataset(CatalogDataset):
    """Digit-Five from the public copies' files (or M3SDA's bundle), KD3A / FACT's protocol."""

    own_split: str = "it has official files"
    samples_down: bool = True

    def count(self, root: Path, domains: tuple[str, ...]) -> tuple[Counts, list[str]]:
        """Per-domain train / test counts of the full files of ``domains``, and one line
        per file whose count differs from the official copy's."""
        counts = file_counts(root, domains=domains)
        where = sources(root, domains)
        if where.get("mnistm") == "folder":  # the one domain of image files: open their headers
            folder = _mnistm_folder(root)
            verify_images(
                [
                    folder / f"mnist_m_{split}" / name
                    for split in _SPLITS
                    for name, _ in _mnistm_list(folder, split)
                ]
            )
        return counts, count_warnings(counts, where)

    def read(self, root: Path, options: LoadOptions) -> DomainDataset:
        seed = options.seed
        full = options.catalog_split == "full"
        return load_digit_five(
            root,
            image_size=self.size(options),
            seed=seed,
            holdout=lambda entries, domain: domain_holdout(entries, seed, domain),
            val_fraction=VAL_FRACTION,
            meta=self.meta(root, options),
            domains=options.domains,
            cache_folder=options.cache_folder,
            train_cap=sys.maxsize if full else TRAIN_CAP,
            test_cap=sys.maxsize if full else TEST_CAP,
        )


DIGIT_FIVE = DigitFiveDataset(
    name=NAME,
    source="Digit-Five (MNIST, MNIST-M, SVHN, USPS, SynDigits; M3SDA, KD3A, FACT)",
    layout=LAYOUT,
    split=SPLIT,
    domains=DOMAINS,
    resolution=RESOLUTION,
    official_totals={d: sum(s.values()) for d, s in OFFICIAL.items()},
    classes=CLASSES,
    description="digits 0..9 in 5 styles (MNIST, MNIST-M, SVHN, USPS, SynDigits)",
    class_source="the digit each file's labels give, SVHN's and SynDigits' 10 as 0",
)
