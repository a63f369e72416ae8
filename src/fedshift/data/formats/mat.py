"""MATLAB v5 ``.mat`` files, read by scipy (nothing is unpickled).

This is the one reader of ``.mat`` files. Before scipy parses a file, its 128-byte header and
the chain of its top-level variable tags are walked (a few reads, no data), so a file that is
no MATLAB file at all (an HTML error page saved as ``.mat``) or one cut short by a broken
download is one :class:`DatasetError` line naming the file, never a scipy traceback or a
misleading "has no variable" message; whatever scipy or numpy still raises on a well-framed
but malformed file becomes the same kind of line.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedshift.core.bounded import open_regular
from fedshift.core.errors import DatasetError

#: the size of a MATLAB v5 file header (text, subsystem offset, version, endian indicator)
HEADER_BYTES = 128
_TAG_BYTES = 8
_ENDIANS = {b"IM": "<", b"MI": ">"}
_VERSION_5 = 0x0100
_VERSION_73 = 0x0200
_VARIABLE_KINDS = (14, 15)  # miMATRIX, miCOMPRESSED: the only top-level elements


def _unreadable(path: Path, why: str) -> DatasetError:
    return DatasetError(f"unreadable .mat file {path}: {why}")


def _truncated(path: Path, size: int, needed: int) -> DatasetError:
    return _unreadable(path, f"truncated ({size} of at least {needed} bytes)")


def check_mat_file(path: Path, expected: str = "") -> None:
    """Raise a one-line DatasetError unless ``path`` is a whole MATLAB v5 file: present (else
    the error names ``expected``, the layout it belongs to), a v5 header, and every top-level
    variable ending inside the file."""
    if not (path.exists() or path.is_symlink()):  # anything else is refused when opened
        where = f" (expected {expected})" if expected else ""
        raise DatasetError(f"missing file {path}{where}")
    with open_regular(path, DatasetError, ".mat file") as handle:
        size = os.fstat(handle.fileno()).st_size
        header = handle.read(HEADER_BYTES)
        if len(header) < HEADER_BYTES:
            if header.startswith(b"MATLAB"):
                raise _truncated(path, size, HEADER_BYTES)
            raise _unreadable(path, "not a MATLAB file (no MATLAB v5 header)")
        endian = _ENDIANS.get(header[126:128])
        if endian is None:
            raise _unreadable(path, "not a MATLAB file (no MATLAB v5 header)")
        (version,) = struct.unpack(endian + "H", header[124:126])
        if version == _VERSION_73:
            raise _unreadable(
                path, "a MATLAB 7.3 (HDF5) file; fedshift reads MATLAB v5 files (save with -v7)"
            )
        if version != _VERSION_5:
            raise _unreadable(path, f"not a MATLAB v5 file (version {version:#06x})")
        offset = HEADER_BYTES
        while offset < size:
            handle.seek(offset)
            tag = handle.read(_TAG_BYTES)
            if len(tag) < _TAG_BYTES:
                raise _truncated(path, size, offset + _TAG_BYTES)
            kind, length = struct.unpack(endian + "II", tag)
            if kind not in _VARIABLE_KINDS:
                raise _unreadable(path, f"corrupt (no variable starts at byte {offset})")
            offset += _TAG_BYTES + length
            if offset > size:
                raise _truncated(path, size, offset)


def _parse_failure(path: Path, exc: Exception) -> DatasetError:
    return _unreadable(path, f"MATLAB v5 expected ({type(exc).__name__}: {exc})")


def mat_variables(path: Path, expected: str) -> dict[str, tuple[int, ...]]:
    """Variable -> shape of a MATLAB v5 file, read from its headers only; a missing file
    raises naming ``expected`` (the layout it belongs to)."""
    from scipy.io import whosmat

    check_mat_file(path, expected)
    try:
        return {name: tuple(shape) for name, shape, _ in whosmat(str(path))}
    except Exception as exc:  # scipy's parser fails in open-ended ways on malformed input
        raise _parse_failure(path, exc) from None


def mat_load(path: Path, names: Sequence[str]) -> dict[str, np.ndarray]:
    """The variables ``names`` of a MATLAB v5 file; a missing one raises."""
    from scipy.io import loadmat

    check_mat_file(path)
    try:
        found = loadmat(str(path), variable_names=list(names))
    except Exception as exc:  # scipy's parser fails in open-ended ways on malformed input
        raise _parse_failure(path, exc) from None
    missing = [n for n in names if n not in found]
    if missing:
        raise DatasetError(f"{path} has no variable {missing[0]!r} (expected {', '.join(names)})")
    return found
