"""LIBSVM text files (``<label> <index>:<value> ...``, 1-based indices), plain or
bzip2-compressed."""

from __future__ import annotations

import bz2
from pathlib import Path

import numpy as np

from fedshift.core.errors import DatasetError


def read_lines(path: Path) -> list[str]:
    """The non-blank lines of a LIBSVM file (``.bz2`` decompressed)."""
    opener = bz2.open if path.suffix == ".bz2" else open
    try:
        with opener(path, "rt", encoding="ascii") as handle:
            return [line for line in handle if line.strip()]
    except (OSError, EOFError, ValueError) as exc:
        raise DatasetError(f"unreadable LIBSVM file {path}: {exc}") from None


def read_libsvm(path: Path, features: int, labels: range) -> tuple[np.ndarray, np.ndarray]:
    """(values N×``features`` float32, labels N int64) of a LIBSVM file; a label outside
    ``labels`` or a malformed line raises naming the file and line."""
    lines = read_lines(path)
    values = np.zeros((len(lines), features), dtype=np.float32)
    out = np.empty(len(lines), dtype=np.int64)
    allowed = f"{labels.start}..{labels.stop - 1}"
    for row, line in enumerate(lines):
        label, *pairs = line.split(maxsplit=1)
        if not label.lstrip("-").isdigit() or int(label) not in labels:
            raise DatasetError(f"{path.name} line {row + 1}: label {label} not in {allowed}")
        out[row] = int(label)
        try:
            numbers = np.array(" ".join(pairs).replace(":", " ").split(), dtype=np.float64)
            index = numbers[0::2].astype(np.int64) - 1
            values[row, index] = numbers[1::2]
            valid = len(numbers) % 2 == 0 and (index.size == 0 or index.min() >= 0)
        except (ValueError, IndexError):
            valid = False
        if not valid:
            raise DatasetError(
                f"{path.name} line {row + 1}: expected '<label {allowed}> "
                f"<index 1..{features}>:<value> ...'"
            )
    return values, out
