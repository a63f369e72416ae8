"""JSON files read with :func:`json.load` only (nothing is unpickled), refused above a size
bound so a wrong path cannot exhaust memory, and above a nesting-depth bound
(:mod:`fedshift.core.bounded`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedshift.core.bounded import read_json_bounded
from fedshift.core.errors import DatasetError

#: the largest JSON file read (1 GiB)
MAX_JSON_BYTES = 1 << 30


def read_json(path: Path) -> Any:
    """The parsed content of ``path``; a missing, oversized (above :data:`MAX_JSON_BYTES`)
    or malformed file raises."""
    limit = MAX_JSON_BYTES
    if not path.is_file():
        raise DatasetError(f"missing file {path}")
    size = path.stat().st_size
    if size > limit:
        raise DatasetError(f"{path} is {size:,} bytes, above the {limit:,}-byte bound for JSON")
    return read_json_bounded(path, DatasetError, limit)
