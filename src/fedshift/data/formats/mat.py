"""MATLAB v5 ``.mat`` files, read by scipy (nothing is unpickled)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedshift.core.errors import DatasetError


def _unreadable(path: Path, exc: Exception) -> DatasetError:
    return DatasetError(f"unreadable .mat file {path} (MATLAB v5 expected): {exc}")


def mat_variables(path: Path, expected: str) -> dict[str, tuple[int, ...]]:
    """Variable -> shape of a MATLAB v5 file, read from its headers only; a missing file
    raises naming ``expected`` (the layout it belongs to)."""
    from scipy.io import whosmat
    from scipy.io.matlab import MatReadError

    if not path.is_file():
        raise DatasetError(f"missing file {path} (expected {expected})")
    try:
        return {name: tuple(shape) for name, shape, _ in whosmat(str(path))}
    except (MatReadError, ValueError, NotImplementedError, OSError, TypeError) as exc:
        raise _unreadable(path, exc) from None


def mat_load(path: Path, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The variables ``names`` of a MATLAB v5 file; a missing one raises."""
    from scipy.io import loadmat
    from scipy.io.matlab import MatReadError

    try:
        found = loadmat(str(path), variable_names=list(names))
    except (MatReadError, ValueError, NotImplementedError, OSError, TypeError) as exc:
        raise _unreadable(path, exc) from None
    missing = [n for n in names if n not in found]
    if missing:
        raise DatasetError(f"{path} has no variable {missing[0]!r} (expected {', '.join(names)})")
    return found
