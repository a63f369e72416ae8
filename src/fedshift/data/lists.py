"""The one reader behind every catalog dataset: split lists, class folders, a seeded
stratified holdout, and decoding each image once into a :class:`DomainDataset`.

An *entry* is ``(image path, 0-based label)``. A dataset loader gathers, per domain, the
entries of its train / val / test splits (from the authors' lists or from class folders) and
:func:`decode_dataset` turns them into uint8 tensors, decoding an image named by several
splits only once.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedshift.core.bounded import open_text
from fedshift.data import image_cache
from fedshift.data.domains import DatasetError, Domain, DomainDataset
from fedshift.data.formats.images import image_files, read_image

if TYPE_CHECKING:  # torch loads only when data is read, not to list or describe it
    import torch


Entry = tuple[Path, int]
SPLITS = ("train", "val", "test")


#: the most digits a list's label may have (a label is a class index)
MAX_LABEL_DIGITS = 9


def list_lines(path: Path) -> Iterator[tuple[str, list[str]]]:
    """``(where, [relative path, label text])`` of each non-empty line of a split list; a
    file that is not UTF-8 text, a NUL byte, a line without a label or a label of more than
    :data:`MAX_LABEL_DIGITS` digits raises DatasetError naming the list and line."""
    try:
        with open_text(path, DatasetError, "split list") as handle:
            for number, line in enumerate(handle, start=1):
                parts = line.rsplit(maxsplit=1)
                if not parts:
                    continue
                where = f"{path.name} line {number}"
                if "\x00" in line:
                    raise DatasetError(f"{where}: holds a NUL byte")
                label = parts[-1].removeprefix("-")
                if len(parts) != 2 or not label.isdigit() or len(label) > MAX_LABEL_DIGITS:
                    raise DatasetError(f"{where}: expected '<domain>/<class>/<file> <label>'")
                yield where, parts
    except UnicodeDecodeError as exc:
        raise DatasetError(f"split list {path} is not UTF-8 text (byte {exc.start})") from None


def read_split_list(
    path: Path,
    images: Path,
    classes: Sequence[str],
    *,
    label_base: int = 0,
    layout: str = "",
    keep: Mapping[str, int] | None = None,
) -> list[Entry]:
    """The entries of one ``<relative path> <label>`` list; a bad line raises DatasetError.

    Paths are relative to ``images``; labels count from ``label_base`` in the order of
    ``classes``. A file inside a folder named after another class than its label is an error.
    ``keep`` (class folder -> new label) reads only the images of those class folders,
    relabelled (DomainNet's 10-class subset).
    """
    if not path.is_file():
        expected = f" (expected {layout})" if layout else ""
        raise DatasetError(f"missing split list {path}{expected}")
    known = set(classes)
    entries = []
    for where, parts in list_lines(path):
        relative, label = parts[0].strip(), int(parts[1]) - label_base
        folder = Path(relative).parent.name
        if keep is not None:
            if folder not in keep:
                continue
            label = keep[folder]
        elif not 0 <= label < len(classes):
            raise DatasetError(
                f"{where}: label {label + label_base} is not in "
                f"{label_base}..{len(classes) - 1 + label_base}"
            )
        elif folder in known and folder != classes[label]:
            raise DatasetError(
                f"{where}: label {label + label_base} ({classes[label]}) but the image is "
                f"in folder {folder!r}"
            )
        image = inside(images, relative, where)
        try:
            found = image.is_file()
        except OSError as exc:  # a name too long for the file system, ...
            raise DatasetError(f"{where} names a file it cannot check ({exc.strerror})") from None
        if not found:
            raise DatasetError(f"{where} names a missing file {image}")
        entries.append((image, label))
    return entries


def inside(root: Path, relative: str, where: str) -> Path:
    """``root / relative``, refused (DatasetError naming ``where``) when ``relative`` is
    absolute or leads out of ``root`` once ``..`` and symbolic links are resolved: a list
    someone sent must not make a run read files from elsewhere on the machine."""
    if Path(relative).is_absolute() or relative.startswith(("/", "\\")):
        raise DatasetError(f"{where}: absolute path {relative!r}; list paths are relative")
    path = root / relative
    if not path.resolve().is_relative_to(root.resolve()):
        raise DatasetError(f"{where}: {relative!r} leads out of {root}")
    return path


def list_classes(paths: Sequence[Path], *, label_base: int = 0) -> list[str]:
    """The class order a set of official lists defines: the folder of each label, by label.

    Labels must run ``label_base``.. without a gap, one per class folder: a label found in two
    class folders, a folder under two labels, or a label out of that range (one that leaves a
    lower label unused) raises DatasetError naming the list and line.
    """
    names: dict[int, str] = {}  # label -> class folder
    labels: dict[str, int] = {}  # class folder -> label
    first_use: dict[int, str] = {}  # label -> the list line that first used it
    for path in paths:
        if not path.is_file():
            raise DatasetError(f"missing split list {path}")
        for where, parts in list_lines(path):
            if parts[1].startswith("-"):
                raise DatasetError(f"{where}: expected '<domain>/<class>/<file> <label>'")
            label = int(parts[1]) - label_base
            folder = Path(parts[0]).parent.name
            if label < 0:
                raise DatasetError(f"{where}: label {parts[1]} is below {label_base}")
            if names.setdefault(label, folder) != folder:
                raise DatasetError(
                    f"{where}: label {parts[1]} is class {names[label]!r} "
                    f"elsewhere but the image is in folder {folder!r}"
                )
            if labels.setdefault(folder, label) != label:
                raise DatasetError(
                    f"{where}: label {parts[1]} for folder {folder!r}, which is label "
                    f"{labels[folder] + label_base} at {first_use[labels[folder]]}"
                )
            first_use.setdefault(label, where)
    if not names:
        raise DatasetError(f"the split lists {', '.join(p.name for p in paths)} name no image")
    unused = sorted(set(range(max(names) + 1)) - set(names))
    if unused:
        above = min(k for k in names if k > unused[0])
        raise DatasetError(
            f"{first_use[above]}: label {above + label_base} is out of range: no list line uses "
            f"label {unused[0] + label_base} (labels run {label_base}.. one per class, no gap)"
        )
    return [names[k] for k in range(len(names))]


def class_folders(domain_dirs: Sequence[Path]) -> list[str]:
    """The sorted union of the class folder names of ``domain_dirs`` (no official order)."""
    names = {
        p.name
        for d in domain_dirs
        for p in d.iterdir()
        if p.is_dir() and not p.name.startswith(".")
    }
    if not names:
        raise DatasetError(f"no class folders in {', '.join(str(d) for d in domain_dirs)}")
    return sorted(names)


def folder_entries(domain_dir: Path, classes: Sequence[str]) -> list[Entry]:
    """Every image of ``domain_dir/<class>/`` (recursively), labelled by ``classes``."""
    entries = []
    for label, name in enumerate(classes):
        folder = domain_dir / name
        if folder.is_dir():
            entries.extend((path, label) for path in image_files(folder))
    if not entries:
        raise DatasetError(f"domain folder {domain_dir} holds no image in a class folder")
    return entries


#: DomainBed's holdout fraction: the share of each domain (or official train list) held out
#: as the validation split of the catalog datasets without a validation list
VAL_FRACTION = 0.2


def held_out_count(class_size: int, fraction: float) -> int:
    """How many images of a class of ``class_size`` :func:`holdout` holds out."""
    if class_size < 2:
        return 0
    return min(class_size - 1, max(1, round(fraction * class_size)))


def holdout(entries: Sequence[Entry], fraction: float, seed: int) -> tuple[list, list]:
    """(kept, held out): ``fraction`` of each class held out at random, seeded.

    Each class with at least two images keeps one and holds out ``round(fraction * n)`` (at
    least one), so the validation split sees every class it can.
    """
    rng = np.random.default_rng(seed)
    by_class: dict[int, list[int]] = {}
    for i, (_, label) in enumerate(entries):
        by_class.setdefault(label, []).append(i)
    held: set[int] = set()
    for label in sorted(by_class):
        members = by_class[label]
        count = held_out_count(len(members), fraction)
        held.update(members[i] for i in rng.permutation(len(members))[:count])
    kept = [e for i, e in enumerate(entries) if i not in held]
    return kept, [e for i, e in enumerate(entries) if i in held]


def _rows_in_split_order(parts: Mapping[str, Sequence[Entry]]) -> dict[Path, int]:
    """A row per distinct image, numbered by first appearance in train, then val, then test."""
    row: dict[Path, int] = {}
    for split in SPLITS:
        for path, _ in parts.get(split, ()):
            row.setdefault(path, len(row))
    return row


def _decoded_in_memory(rows: Sequence[Path], size: int, pool: ThreadPoolExecutor) -> torch.Tensor:
    import torch

    pixels = torch.empty((len(rows), 3, size, size), dtype=torch.uint8)
    for i, image in enumerate(pool.map(lambda p: read_image(p, size), rows)):
        pixels[i].numpy()[...] = image
    return pixels


def _cached_pixels(
    name: str,
    domain: str,
    rows: Sequence[Path],
    size: int,
    pool: ThreadPoolExecutor,
    folder: Path,
    meta: Mapping,
) -> tuple[torch.Tensor, Path | None]:
    """The domain's pixels mapped from the image cache, decoded into it first if needed;
    decoded into memory (with a warning) when the cache folder cannot be written."""
    import torch

    root = str(meta.get("root", ""))
    key = image_cache.cache_key(name, root, domain, size, rows)
    data, sidecar = image_cache.cache_paths(folder, name, domain, size, key)
    shape = (len(rows), 3, size, size)
    pixels = image_cache.open_cached(data, sidecar, shape)
    if pixels is None:
        description = {
            "dataset": name,
            "domain": domain,
            "root": root,
            "image_size": size,
            "split": meta.get("split", ""),
            "key": key,
        }
        try:
            folder.mkdir(parents=True, exist_ok=True)  # before any decoding starts
            decoded = pool.map(lambda p: read_image(p, size), rows)
            image_cache.write_cache(data, sidecar, shape, decoded, description)
            pixels = np.load(data, mmap_mode="r", allow_pickle=False)
        except OSError as exc:
            warnings.warn(
                f"fedshift: could not write the image cache {data} ({exc}); decoding "
                f"{name}/{domain} into memory",
                RuntimeWarning,
                stacklevel=3,
            )
            return _decoded_in_memory(rows, size, pool), None
    with warnings.catch_warnings():  # read-only: only RowGather reads it (see decode_dataset)
        warnings.filterwarnings("ignore", "The given NumPy array is not writable")
        return torch.from_numpy(pixels), data


def decode_dataset(
    name: str,
    splits: Mapping[str, Mapping[str, Sequence[Entry]]],
    classes: Sequence[str],
    image_size: int,
    meta: Mapping,
    *,
    cache_folder: Path | None = None,
) -> DomainDataset:
    """Decode domain -> split -> entries into RGB ``image_size`` squares, each file once.

    Images are stored in one array per domain, train rows first, then val, then the rest; a
    split's samples are kept in row order. With ``cache_folder`` that array is a read-only
    memory map of the domain's file in the image cache (:mod:`fedshift.data.image_cache`),
    decoded there on the first load only, and every split is a
    :class:`~fedshift.core.split.RowGather` of its rows (reads copy, so the map is never
    written). Without it the array is decoded into memory, a split covering a contiguous block
    of rows (the train and val splits, a test split that is the whole domain) is a view of it
    and any other split a RowGather: never a copy. ``meta`` gains ``counts``
    (domain -> split -> images), ``classes`` and ``image_cache`` (domain -> file, or empty).
    """
    import torch

    from fedshift.core.split import RowGather, Split

    if isinstance(image_size, bool) or int(image_size) < 1:
        raise DatasetError(f"image_size must be a positive integer, got {image_size!r}")
    size = int(image_size)
    workers = max(1, min(8, os.cpu_count() or 1))
    domains, counts, cached = {}, {}, {}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for domain, parts in splits.items():
            row = _rows_in_split_order(parts)
            if not row:
                raise DatasetError(f"{name}/{domain} has no image in any split")
            if cache_folder is None:
                pixels, cached[domain] = _decoded_in_memory(list(row), size, pool), None
            else:
                pixels, cached[domain] = _cached_pixels(
                    name, domain, list(row), size, pool, cache_folder, meta
                )
            tensors = {}
            for split in SPLITS:
                items = sorted(parts.get(split, ()), key=lambda entry: row[entry[0]])
                index = torch.as_tensor([row[p] for p, _ in items], dtype=torch.long)
                labels = torch.as_tensor([label for _, label in items], dtype=torch.long)
                first = int(index[0]) if len(items) else 0
                if cached[domain] is None and torch.equal(
                    index, torch.arange(first, first + len(items))
                ):
                    x = pixels[first : first + len(items)]
                else:
                    x = RowGather.take(pixels, index)
                tensors[split] = Split(x=x, y=labels)
            domains[domain] = Domain(name=domain, **tensors)
            counts[domain] = {split: len(parts.get(split, ())) for split in SPLITS}
    return DomainDataset(
        name=name,
        domains=domains,
        classes=list(classes),
        channels=3,
        image_size=size,
        meta={
            **meta,
            "classes": list(classes),
            "counts": counts,
            "image_cache": {d: str(p) if p else "" for d, p in cached.items()},
        },
    )
