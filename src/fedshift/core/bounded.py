"""Bounded parsing of the JSON and TOML files fedshift reads: a size bound, a nesting-depth
bound and one error type chosen by the caller (a :class:`FedshiftError`, or a cache's own
"rebuild it" error), so a hostile or broken file is a one-line error (never a
``RecursionError``, a ``MemoryError`` or a huge-integer ``ValueError``)."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

#: deepest nesting of arrays and objects (tables) a JSON or TOML file may hold
MAX_DEPTH = 64
#: largest TOML file read (config files and presets are a few KiB)
MAX_TOML_BYTES = 1 << 20
#: largest run-directory JSON file read (config.json, summary.json)
MAX_RUN_JSON_BYTES = 64 << 20
#: largest sidecar or manifest JSON of a cache read (they are a few KiB)
MAX_SIDECAR_BYTES = 16 << 20


def check_regular_file(path: str | os.PathLike, what: str, error: type[Exception]) -> Path:
    """``path`` when it is a regular file (or a link to one); otherwise ``error`` saying
    what it is instead: missing, a folder, or a device, pipe or socket (``/dev/zero``)."""
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        raise error(f"{what} {path} is a folder; give a file")
    if path.exists():
        raise error(f"{what} {path} is not a regular file (a device, pipe or socket); give a file")
    raise error(f"{what} {path} does not exist")


def read_bytes_bounded(
    path: str | os.PathLike, limit: int, error: type[Exception], what: str
) -> bytes:
    """The bytes of ``path``; a missing, unreadable or over-``limit`` file raises ``error``."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(limit + 1)
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    if len(raw) > limit:
        raise error(f"{what} {path} is larger than the {limit:,}-byte bound")
    return raw


def nesting_depth(value: Any) -> int:
    """The deepest nesting of lists and dicts in ``value`` (iterative: no recursion)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _check_depth(value: Any, error: type[Exception], where: str) -> Any:
    if nesting_depth(value) > MAX_DEPTH:
        raise error(f"{where} nests deeper than {MAX_DEPTH} levels")
    return value


def parse_json(text: str | bytes, error: type[Exception], where: str) -> Any:
    """The JSON value of ``text``; malformed, too deep or unparsable numbers raise ``error``."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise error(f"{where} nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, integer digit limit
        raise error(f"{where} is not valid JSON: {exc}") from None
    return _check_depth(value, error, where)


def parse_toml(raw: bytes, error: type[Exception], where: str) -> dict[str, Any]:
    """The TOML document of ``raw`` (UTF-8); malformed or too deep raises ``error``."""
    try:
        value = tomllib.loads(raw.decode("utf-8"))
    except RecursionError:
        raise error(f"{where} nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # TOMLDecodeError, UnicodeDecodeError, integer digit limit
        raise error(f"{where} is not valid TOML: {exc}") from None
    return _check_depth(value, error, where)


def read_json_bounded(
    path: str | os.PathLike, error: type[Exception], limit: int = MAX_RUN_JSON_BYTES
) -> Any:
    """The JSON value of the file ``path`` under the size and depth bounds."""
    raw = read_bytes_bounded(path, limit, error, "JSON file")
    return parse_json(raw, error, f"JSON file {path}")


def read_toml_bounded(
    path: str | os.PathLike, error: type[Exception], what: str = "config file"
) -> dict[str, Any]:
    """The TOML document of the file ``path`` under the size and depth bounds."""
    raw = read_bytes_bounded(path, MAX_TOML_BYTES, error, what)
    return parse_toml(raw, error, f"{what} {path}")


def load_npy(path: str | os.PathLike, error: type[Exception], mmap_mode: str | None = None) -> Any:
    """The ``.npy`` array in ``path`` (never a pickle, never an ``.npz`` archive), mapped
    with ``mmap_mode``; a file that is not one raises ``error``. The shape in its header is
    checked against the file's size by numpy (a mapping longer than the file, or a read
    that comes up short, fails), so a header cannot make it allocate more than the file."""
    import numpy as np  # not at import time: the config readers above need no numpy

    try:
        with open(path, "rb") as handle:
            magic = handle.read(6)
        if magic != b"\x93NUMPY":
            raise ValueError("no .npy magic")
        return np.load(path, mmap_mode=mmap_mode, allow_pickle=False)
    except Exception as exc:  # np.load raises OSError, ValueError, EOFError,
        # SyntaxError or tokenize.TokenError (its header is a Python literal), MemoryError...
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise error(f"cannot read {path} as a .npy array ({reason})") from None
