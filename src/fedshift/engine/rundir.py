"""One writer per run directory: an exclusive lock held while a process runs into it.

Two processes writing the same run directory (two sweeps over the same plan, a ``--resume``
of a run that is still going) would interleave ``metrics.jsonl`` rows and overwrite each
other's checkpoints. The writer holds ``flock`` on ``RUN_DIR/.lock`` for the whole run, so a
second writer fails at once with a clear error and a second sweep skips that run. The lock
is released by the kernel when its process ends, so a killed run never leaves it stale.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from fedshift.core.errors import ConfigError

try:
    import fcntl
except ImportError:  # not POSIX: runs go unlocked
    fcntl = None

LOCK_NAME = ".lock"

#: run directories this process holds, with how many nested claims hold each
_held: dict[Path, int] = {}


class RunDirectoryBusy(ConfigError):
    """Another process is writing this run directory."""


@contextlib.contextmanager
def claim_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold the run directory's lock (creating the directory); re-entrant in one process."""
    key = Path(run_dir).resolve()
    if key in _held:
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    key.mkdir(parents=True, exist_ok=True)
    handle = open(key / LOCK_NAME, "a")
    try:
        if fcntl is not None:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RunDirectoryBusy(
                    f"run directory {run_dir} is in use by another fedshift process "
                    f"(it holds {LOCK_NAME}); wait for it to finish or use another --out"
                ) from None
        _held[key] = 1
        try:
            yield
        finally:
            del _held[key]
    finally:
        handle.close()  # closing the file releases the lock


def run_dir_contents(run_dir: Path) -> list[Path]:
    """What the directory holds besides its lock file."""
    return [p for p in Path(run_dir).iterdir() if p.name != LOCK_NAME]


def clear_run_dir(run_dir: Path) -> None:
    """Empty a claimed run directory, keeping the lock file its claim holds."""
    for path in run_dir_contents(run_dir):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            os.remove(path)
