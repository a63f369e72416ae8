"""The catalog datasets' decoded-image cache: one ``.npy`` file of uint8 ``(N, 3, S, S)``
pixels per (dataset, root, domain, resolution, row order), memory-mapped on later loads.

A domain's images are decoded once, streamed into the file as they come (so a first load
holds no more than the decoder's images in flight), and the file is moved into place
atomically. Later loads map it read-only (``mmap_mode="r"``): every split of the domain is a
:class:`~fedshift.core.split.RowGather` over the mapping, pages are read when a batch
touches them, and a read returns a copy, so nothing can write to the file. (A copy-on-write
mapping, ``"c"``, is charged to the commit limit as if it were memory: Linux refuses one
larger than RAM + swap, e.g. DomainNet's 26 GB quickdraw or real domain at 224 px on a
24 GB machine without swap; a read-only one is not.)

The key hashes the dataset name, its root, the domain, the resolution and every row's path,
size and modification time in row order (the split, ``split_seed`` included, decides that
order), so a changed image or split makes a new file. A sidecar JSON records the shape, the
byte size and a sha256 over the ``.npy`` header and 256 evenly spaced 4 KiB blocks (a full
hash would read the whole file on every load); a missing, short or mismatching file is
rebuilt with a warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from fedshift.core.bounded import MAX_SIDECAR_BYTES, load_npy, open_regular, read_json_bounded
from fedshift.core.errors import DatasetError

#: bump when the file layout or the decoder's output changes: old files are then ignored
CACHE_VERSION = 1
#: the sub-folder of the fedshift cache dir holding these files
SUBDIR = "catalog"
_BLOCK = 4096
_SAMPLES = 256


def cache_folder(cache_dir: str | os.PathLike | None) -> Path:
    """``cache_dir``/catalog, or ``$FEDSHIFT_CACHE``/catalog, or ``~/.cache/fedshift/catalog``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser() / SUBDIR
    env = os.environ.get("FEDSHIFT_CACHE")
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "fedshift"
    return base / SUBDIR


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def cache_key(dataset: str, root: str, domain: str, size: int, rows: Sequence[Path]) -> str:
    """The sha256 naming one domain's cache file (see the module docstring)."""
    digest = hashlib.sha256()
    head = {"v": CACHE_VERSION, "dataset": dataset, "root": root, "domain": domain, "size": size}
    digest.update(json.dumps(head, sort_keys=True).encode())
    for path in rows:
        stat = path.stat()
        digest.update(f"\n{path}\t{stat.st_size}\t{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def cache_paths(folder: Path, dataset: str, domain: str, size: int, key: str) -> tuple[Path, Path]:
    """(the ``.npy`` file, its sidecar JSON)."""
    stem = f"{_safe(dataset)}-{_safe(domain)}-{size}px-{key[:20]}"
    return folder / f"{stem}.npy", folder / f"{stem}.json"


def sampled_digest(path: Path) -> str:
    """sha256 of the file's first block (the ``.npy`` header), its last block and 256 evenly
    spaced 4 KiB blocks, plus its size."""
    with open_regular(path, DatasetError, "image cache") as handle:
        size = os.fstat(handle.fileno()).st_size
        digest = hashlib.sha256(str(size).encode())
        last = max(0, size - _BLOCK)
        offsets = sorted({0, last, *(last * i // (_SAMPLES - 1) for i in range(_SAMPLES))})
        for offset in offsets:
            handle.seek(offset)
            digest.update(handle.read(_BLOCK))
    return digest.hexdigest()


def open_cached(
    data: Path, sidecar: Path, shape: tuple[int, ...], mmap_mode: str = "r"
) -> np.ndarray | None:
    """The cached pixels mapped read-only (``mmap_mode="c"``: copy-on-write, for callers
    that hand out plain tensors), or None (with a warning if a file was bad)."""
    if not data.exists() and not sidecar.exists():
        return None
    try:
        info = read_json_bounded(sidecar, DatasetError, MAX_SIDECAR_BYTES)
        if not isinstance(info, dict):
            raise ValueError(f"its sidecar holds a {type(info).__name__}, not an object")
        if info.get("version") != CACHE_VERSION or info.get("shape") != list(shape):
            raise ValueError(f"it describes shape {info.get('shape')}, expected {list(shape)}")
        if data.stat().st_size != info.get("bytes"):
            raise ValueError(f"{data.stat().st_size} bytes, expected {info.get('bytes')}")
        if sampled_digest(data) != info.get("sha256_sampled"):
            raise ValueError("checksum mismatch")
        pixels = load_npy(data, DatasetError, mmap_mode)
        if pixels.dtype != np.uint8 or pixels.shape != shape:
            raise ValueError(f"array {pixels.dtype} {pixels.shape}, expected uint8 {shape}")
        return pixels
    except (OSError, ValueError) as exc:
        warnings.warn(
            f"fedshift: image cache {data} is unusable ({exc}); decoding the images again",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def _replace_atomically(path: Path, write: Callable[[object], None]) -> None:
    """Write ``path`` through a temp file in its folder, fsynced, then renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_cache(
    data: Path,
    sidecar: Path,
    shape: tuple[int, ...],
    images: Iterable[np.ndarray],
    description: dict,
) -> None:
    """Stream ``images`` (uint8 arrays of ``shape[1:]``, in row order) into ``data``.

    Raises OSError when the folder cannot be written (the caller then decodes into memory)."""
    data.parent.mkdir(parents=True, exist_ok=True)
    print(
        f"fedshift: decoding {description.get('dataset')}/{description.get('domain')} "
        f"({shape[0]} images at {shape[-1]} px) once into the image cache {data}",
        file=sys.stderr,
        flush=True,
    )

    def write(handle) -> None:
        header = {"descr": "|u1", "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(handle, header)
        written = 0
        for image in images:
            handle.write(np.ascontiguousarray(image, dtype=np.uint8).tobytes())
            written += 1
        if written != shape[0]:
            raise ValueError(f"wrote {written} images, expected {shape[0]}")

    _replace_atomically(data, write)
    info = {
        **description,
        "version": CACHE_VERSION,
        "shape": list(shape),
        "bytes": data.stat().st_size,
        "sha256_sampled": sampled_digest(data),
    }
    text = (json.dumps(info, indent=2) + "\n").encode()
    _replace_atomically(sidecar, lambda handle: handle.write(text))
