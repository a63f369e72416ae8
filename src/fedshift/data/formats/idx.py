"""idx files (LeCun's MNIST format, optionally gzip-compressed): a big-endian magic number,
the dimensions, then the uint8 payload."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from fedshift.core.errors import DatasetError

#: magic number of each kind of uint8 idx file
MAGIC = {"images": 2051, "labels": 2049}


def find_idx(folder: Path, name: str, expected: str) -> Path:
    """``folder/name`` or ``folder/name.gz``, whichever exists; neither raises."""
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    raise DatasetError(f"missing file {folder / name} (or .gz; expected {expected})")


def read_idx(path: Path, kind: str, header_only: bool = False) -> tuple[tuple[int, ...], bytes]:
    """(dimensions, payload) of an idx ``kind`` file (``images``: 3 dimensions, ``labels``:
    1); the payload is empty when ``header_only``."""
    dims = 3 if kind == "images" else 1
    head_size = 4 + 4 * dims
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as handle:
            head = handle.read(head_size)
            payload = b"" if header_only else handle.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise DatasetError(f"unreadable idx file {path}: {exc}") from None
    if len(head) < head_size:
        raise DatasetError(f"{path} is {len(head)} bytes, shorter than an idx header")
    magic, *shape = np.frombuffer(head, dtype=">u4").tolist()
    if magic != MAGIC[kind]:
        raise DatasetError(
            f"{path} has magic number {magic}, expected {MAGIC[kind]} (idx {kind} file)"
        )
    return tuple(shape), payload
