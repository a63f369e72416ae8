"""The one rule for every file a command writes for the user (a figure, a weights file).

A command writes only to a path whose suffix names what it writes, and never over an
existing file that fedshift did not write for that same purpose (a run's checkpoint or
config, a user's own picture) unless the user says ``--force``. The check runs before any
work, and again just before the write, and touches nothing when it refuses.

How fedshift knows a file is its own: every figure it writes carries :data:`FIGURE_MARK` in
the format's own metadata (PNG ``Software``, PDF and SVG ``Creator``, a JPEG comment), so
running ``fedshift plot ...`` twice replaces its own figure; a weights file is fedshift's when
its ``.json`` sidecar says so (:mod:`fedshift.pretrain`). Figures are written to a temp file
and renamed into place, so a failed write leaves the old file whole.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedshift.core.bounded import open_regular
from fedshift.core.errors import ConfigError
from fedshift.core.state import write_atomically

#: the mark every figure fedshift writes carries in its metadata
FIGURE_MARK = "fedshift figure"
#: the first bytes of each figure format, so a renamed file of another kind is not taken for one
FIGURE_MAGIC = {
    ".png": (b"\x89PNG\r\n\x1a\n",),
    ".pdf": (b"%PDF",),
    ".svg": (b"<?xml", b"<svg"),
    ".jpg": (b"\xff\xd8\xff",),
    ".jpeg": (b"\xff\xd8\xff",),
}
#: figure suffixes a command writes, in the order messages list them
FIGURE_SUFFIXES = tuple(FIGURE_MAGIC)
#: a file larger than this is never taken for a figure fedshift wrote (its mark is not sought)
MAX_FIGURE_BYTES = 64 * 2**20


@dataclass(frozen=True)
class OutputKind:
    """What a command writes: its name in messages, the suffixes it may have, and how to tell
    an existing file that fedshift wrote as this kind (which it may replace)."""

    name: str
    suffixes: tuple[str, ...]
    is_own: Callable[[Path], bool]


def is_fedshift_figure(path: Path) -> bool:
    """Whether ``path`` is a figure of its suffix's format that carries :data:`FIGURE_MARK`."""
    magic = FIGURE_MAGIC.get(path.suffix.lower())
    try:
        if magic is None or not path.is_file() or path.stat().st_size > MAX_FIGURE_BYTES:
            return False
        with open_regular(path, ConfigError, "figure") as handle:
            data = handle.read(MAX_FIGURE_BYTES + 1)
    except (OSError, ConfigError):
        return False
    return data.startswith(magic) and FIGURE_MARK.encode() in data


FIGURE = OutputKind("figure", FIGURE_SUFFIXES, is_fedshift_figure)


def check_output(
    path: str | os.PathLike, kind: OutputKind, flag: str, *, force: bool = False
) -> Path:
    """``path`` when ``kind`` may be written there; a one-line ConfigError otherwise.

    Refused: a suffix that is not one of ``kind.suffixes``, a folder, a missing parent
    folder, and, without ``force``, an existing file (or link) that is not one fedshift wrote
    as ``kind``."""
    path = Path(path)
    wanted = ", ".join(kind.suffixes)
    if path.suffix.lower() not in kind.suffixes:
        shown = repr(path.suffix) if path.suffix else "a file without suffix"
        raise ConfigError(
            f"{flag} {path}: cannot write a {kind.name} as {shown}; give a file ending in {wanted}"
        )
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a folder; give a file ending in {wanted}")
    if not path.resolve().parent.is_dir():
        raise ConfigError(f"{flag} {path}: folder {path.parent} does not exist")
    if (path.exists() or path.is_symlink()) and not force and not kind.is_own(path):
        raise ConfigError(
            f"{flag} {path} exists and is not a {kind.name} fedshift wrote; nothing was "
            "changed: give another path, or --force to replace it"
        )
    return path


def figure_metadata(suffix: str) -> dict[str, Any]:
    """``savefig`` keywords that put :data:`FIGURE_MARK` into a figure of ``suffix``."""
    suffix = suffix.lower()
    if suffix == ".png":
        return {"metadata": {"Software": FIGURE_MARK}}
    if suffix in (".pdf", ".svg"):
        return {"metadata": {"Creator": FIGURE_MARK}}
    return {"pil_kwargs": {"comment": FIGURE_MARK}}


def write_figure(
    fig: Any, path: str | os.PathLike, flag: str, *, force: bool = False, **savefig: Any
) -> Path:
    """Save the matplotlib figure ``fig`` to ``path`` under the rule of :func:`check_output`,
    in the format its suffix names, marked as fedshift's, atomically; returns the path."""
    path = check_output(path, FIGURE, flag, force=force)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.suffix.lower()[1:], **figure_metadata(path.suffix), **savefig)
    write_atomically(path, [buffer.getvalue()])
    return path
