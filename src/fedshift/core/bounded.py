"""Bounded parsing of the JSON and TOML files fedshift reads: a size bound, a nesting-depth
bound and one error type chosen by the caller (a :class:`FedshiftError`, or a cache's own
"rebuild it" error), so a hostile or broken file is a one-line error (never a
``RecursionError``, a ``MemoryError`` or a huge-integer ``ValueError``)."""

from __future__ import annotations

import errno
import io
import json
import os
import stat
import tomllib
from pathlib import Path
from typing import IO, Any

#: deepest nesting of arrays and objects (tables) a JSON or TOML file may hold
MAX_DEPTH = 64
#: largest TOML file read (config files and presets are a few KiB)
MAX_TOML_BYTES = 1 << 20
#: largest run-directory JSON file read (config.json, summary.json)
MAX_RUN_JSON_BYTES = 64 << 20
#: largest sidecar or manifest JSON of a cache read (they are a few KiB)
MAX_SIDECAR_BYTES = 16 << 20
#: largest ``metrics.jsonl`` read (a round's row is a few KiB)
MAX_METRICS_BYTES = 256 << 20


def _kind_of(mode: int) -> str:
    """What a file that is not a regular file is, in words."""
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "an unknown kind of file"


def open_regular(
    path: str | os.PathLike, error: type[Exception], what: str = "file", *, append: bool = False
) -> IO[bytes]:
    """``path`` opened for reading (or appending, with ``append``) when it is a regular file
    (or a link to one); anything else raises ``error`` in one line. The open never blocks:
    it passes ``O_NONBLOCK``, so a named pipe without a writer (or, for ``append``, without
    a reader) cannot hang the caller, and the opened file, not the name, is checked with
    ``fstat``, so a swap between a check and the open changes nothing."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if append:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise error(f"{what} {path} is a symbolic link loop; give a file") from None
        if exc.errno == errno.ENOENT:
            raise error(f"{what} {path} does not exist") from None
        if exc.errno == errno.EISDIR:
            raise error(f"{what} {path} is a folder; give a file") from None
        if exc.errno == errno.ENXIO:  # a FIFO opened for writing with no reader
            raise error(f"{what} {path} is a named pipe; give a file") from None
        raise error(f"cannot open {what} {path}: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise error(f"{what} {path} is a folder; give a file")
        if not stat.S_ISREG(mode):
            raise error(f"{what} {path} is not a regular file ({_kind_of(mode)}); give a file")
        os.set_blocking(fd, True)  # a regular file: reads behave as usual from here on
        return os.fdopen(fd, "ab" if append else "rb")
    except BaseException:
        os.close(fd)
        raise


def check_regular_file(path: str | os.PathLike, what: str, error: type[Exception]) -> Path:
    """``path`` when it is a regular file (or a link to one); otherwise ``error`` saying
    what it is instead: missing, a folder, a link loop, or a device, pipe or socket."""
    with open_regular(path, error, what):
        return Path(path)


def read_bytes_bounded(
    path: str | os.PathLike, limit: int, error: type[Exception], what: str
) -> bytes:
    """The bytes of ``path``; a missing, unreadable, over-``limit`` or not regular file
    (see :func:`open_regular`) raises ``error``."""
    path = Path(path)
    try:
        with open_regular(path, error, what) as handle:
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


def open_text(
    path: str | os.PathLike,
    error: type[Exception],
    what: str,
    *,
    errors: str = "strict",
    newline: str | None = None,
) -> IO[str]:
    """``path`` opened as UTF-8 text under :func:`open_regular`'s rules."""
    return io.TextIOWrapper(
        open_regular(path, error, what), encoding="utf-8", errors=errors, newline=newline
    )


def read_text_lines(
    path: str | os.PathLike, error: type[Exception], what: str, limit: int = MAX_METRICS_BYTES
) -> list[str]:
    """The lines of the UTF-8 text file ``path`` (bytes that are not UTF-8 replaced), read
    under :func:`read_bytes_bounded`'s rules."""
    return read_bytes_bounded(path, limit, error, what).decode("utf-8", "replace").splitlines()


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

    with open_regular(path, error, ".npy file") as handle:
        try:
            if handle.read(6) != b"\x93NUMPY":
                raise ValueError("no .npy magic")
            if mmap_mode is None:
                handle.seek(0)
                return np.load(handle, allow_pickle=False)
            # numpy maps a name, not a handle: the one this process holds, where there is one
            held = f"/proc/self/fd/{handle.fileno()}"
            return np.load(
                held if os.path.exists(held) else path, mmap_mode=mmap_mode, allow_pickle=False
            )
        except Exception as exc:  # np.load raises OSError, ValueError, EOFError,
            # SyntaxError or tokenize.TokenError (its header is a Python literal), MemoryError...
            reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            raise error(f"cannot read {path} as a .npy array ({reason})") from None
