"""The errors fedshift raises on bad input, one type per kind of input.

Each message names what was expected; the command line turns every :class:`FedshiftError`
into one line and exit code 2. They live at the bottom layer so every module can raise them
without importing the layers above.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from pathlib import Path


class FedshiftError(Exception):
    """An error caused by the user's input or files (not a bug): the base the command line
    reports as one line ``fedshift: error: ...``; each subclass keeps its builtin ancestry so
    ``except ValueError`` / ``except OSError`` callers still catch it."""


class ConfigError(FedshiftError, ValueError):
    """A configuration that cannot run; the message names the valid choices."""


class DatasetError(FedshiftError, ValueError):
    """A dataset could not be loaded, built or partitioned; the message says what was expected."""


class ModelError(FedshiftError, ValueError):
    """A model that cannot be built as asked (an option, a size, a variant) or a weights file
    that is missing or does not fit it; the message names what was expected."""


class CheckpointError(FedshiftError, RuntimeError):
    """A checkpoint that is missing, corrupt or belongs to another run."""


class RoundFailed(FedshiftError, RuntimeError):
    """Too few clients replied for the failure policy."""


class StorageError(FedshiftError, OSError):
    """A run file could not be written (a full disk, a read-only folder); names the file."""

    def __init__(self, message: str, path: str | Path):
        super().__init__(message)
        self.path = Path(path)


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run; carries the run directory so the user can be told how to resume."""

    def __init__(self, run_dir: str | Path, checkpointed: bool):
        super().__init__(str(run_dir))
        self.run_dir = Path(run_dir)
        self.checkpointed = checkpointed


def closest(word: str, choices: Iterable[str]) -> str | None:
    """The choice closest to ``word`` (``-`` read as ``_``, case ignored), or None."""
    by_normal = {c.replace("-", "_").lower(): c for c in choices}
    normal = str(word).strip().replace("-", "_").lower()
    if normal in by_normal:
        return by_normal[normal]
    close = difflib.get_close_matches(normal, list(by_normal), n=1, cutoff=0.6)
    return by_normal[close[0]] if close else None


def did_you_mean(word: str, choices: Iterable[str], aliases: dict[str, str] | None = None) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to ``word``, or ``""`` when none is
    close: the hint of every "unknown key / name" message. ``aliases`` maps other common
    names (``learning_rate``) to a choice (``lr``)."""
    aliases = aliases or {}
    match = closest(word, [*choices, *aliases])
    if match is None:
        return ""
    return f" (did you mean {aliases.get(match, match)!r}?)"
