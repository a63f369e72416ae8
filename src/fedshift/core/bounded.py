"""Bounded parsing of the JSON and TOML files fedshift reads: a size bound, a nesting-depth
bound and one error type chosen by the caller, so a hostile or broken file is a one-line
error (never a ``RecursionError``, a ``MemoryError`` or a huge-integer ``ValueError``)."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any

from fedshift.core.errors import FedshiftError

#: deepest nesting of arrays and objects (tables) a JSON or TOML file may hold
MAX_DEPTH = 64
#: largest TOML file read (config files and presets are a few KiB)
MAX_TOML_BYTES = 1 << 20
#: largest run-directory JSON file read (config.json, summary.json)
MAX_RUN_JSON_BYTES = 64 << 20


def read_bytes_bounded(
    path: str | os.PathLike, limit: int, error: type[FedshiftError], what: str
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


def _check_depth(value: Any, error: type[FedshiftError], where: str) -> Any:
    if nesting_depth(value) > MAX_DEPTH:
        raise error(f"{where} nests deeper than {MAX_DEPTH} levels")
    return value


def parse_json(text: str | bytes, error: type[FedshiftError], where: str) -> Any:
    """The JSON value of ``text``; malformed, too deep or unparsable numbers raise ``error``."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise error(f"{where} nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, integer digit limit
        raise error(f"{where} is not valid JSON: {exc}") from None
    return _check_depth(value, error, where)


def parse_toml(raw: bytes, error: type[FedshiftError], where: str) -> dict[str, Any]:
    """The TOML document of ``raw`` (UTF-8); malformed or too deep raises ``error``."""
    try:
        value = tomllib.loads(raw.decode("utf-8"))
    except RecursionError:
        raise error(f"{where} nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # TOMLDecodeError, UnicodeDecodeError, integer digit limit
        raise error(f"{where} is not valid TOML: {exc}") from None
    return _check_depth(value, error, where)


def read_json_bounded(
    path: str | os.PathLike, error: type[FedshiftError], limit: int = MAX_RUN_JSON_BYTES
) -> Any:
    """The JSON value of the file ``path`` under the size and depth bounds."""
    raw = read_bytes_bounded(path, limit, error, "JSON file")
    return parse_json(raw, error, f"JSON file {path}")


def read_toml_bounded(
    path: str | os.PathLike, error: type[FedshiftError], what: str = "config file"
) -> dict[str, Any]:
    """The TOML document of the file ``path`` under the size and depth bounds."""
    raw = read_bytes_bounded(path, MAX_TOML_BYTES, error, what)
    return parse_toml(raw, error, f"{what} {path}")
