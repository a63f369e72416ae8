"""Run directories: one writer at a time, checked before any work, safe to start again.

Two processes writing the same run directory (two sweeps over the same plan, a ``--resume``
of a run that is still going) would interleave ``metrics.jsonl`` rows and overwrite each
other's checkpoints. The writer holds ``flock`` on ``RUN_DIR/.lock`` for the whole run, so a
second writer fails at once with a clear error and a second sweep skips that run. The lock
is released by the kernel when its process ends, so a killed run never leaves it stale.

Before the lock is taken, :func:`check_run_dir` refuses a ``--out`` that is a file, sits in
a place that cannot be written, or holds something other than a fedshift run (so a refused
folder is left exactly as it was, without a lock file). Under the lock, :func:`settle_run_dir`
removes temp files a killed writer left and clears a run that stopped before its first
checkpoint, so it can simply be started again.

fedshift deletes only what is provably its own: a folder it claims empty (or creates) gets a
marker file (:data:`MARKER_NAME`) before anything else, and :func:`clear_run_dir` empties a
folder only when the marker is there and every entry is a name a run writes. A project
folder that happens to hold a ``config.json`` is refused with one line, never cleared.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from fedshift.core.bounded import open_regular
from fedshift.core.errors import CheckpointError, ConfigError
from fedshift.core.outputs import is_fedshift_figure
from fedshift.core.runfiles import (
    CHECKPOINT,
    LOCK_NAME,
    MARKER_NAME,
    OWN_FOLDER_ENTRIES,
    OWN_NAMES,
    OWN_TEMP_FILE,
    RunFiles,
)

try:
    import fcntl
except ImportError:  # not POSIX: runs go unlocked
    fcntl = None

log = logging.getLogger(__name__)

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
    created = not key.exists()
    try:
        key.mkdir(parents=True, exist_ok=True)
        handle = open_regular(key / LOCK_NAME, ConfigError, "lock file", append=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot use {run_dir} as a run directory: {exc.strerror or exc}"
        ) from None
    try:
        if fcntl is not None:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise RunDirectoryBusy(
                    f"run directory {run_dir} is in use by another fedshift process "
                    f"(it holds {LOCK_NAME}); wait for it to finish or use another --out"
                ) from None
        if not run_dir_contents(key):  # new or empty: from now on provably a run's folder
            (key / MARKER_NAME).write_text("a fedshift run directory\n")
        _held[key] = 1
        try:
            yield
        finally:
            del _held[key]
            if not run_dir_contents(key):
                remove_unused_claim(key, created=created)
    finally:
        handle.close()  # closing the file releases the lock


def remove_unused_claim(run_dir: Path, *, created: bool) -> None:
    """A run that stopped before writing anything (a late config error) leaves no trace:
    its marker and lock go, and the folder too when the claim created it."""
    for name in (MARKER_NAME, LOCK_NAME):
        with contextlib.suppress(FileNotFoundError):
            (run_dir / name).unlink()
    if created:
        with contextlib.suppress(OSError):  # another process may have claimed it meanwhile
            run_dir.rmdir()


def run_dir_contents(run_dir: Path) -> list[Path]:
    """What the directory holds besides its lock file and marker."""
    return [p for p in Path(run_dir).iterdir() if p.name not in (LOCK_NAME, MARKER_NAME)]


def foreign_entries(run_dir: Path) -> list[str]:
    """Entries of ``run_dir`` that no fedshift run writes, sorted; every name when the folder
    lacks the marker a run writes first (then nothing in it is provably fedshift's).

    Fedshift's own subfolders are looked into too: an entry of ``tensorboard/`` or ``wandb/``
    that its tracker does not write is listed as ``tensorboard/NAME``. A figure fedshift wrote
    into the run (``plot tsne``'s default ``tsne.png``) is its own."""
    run_dir = Path(run_dir)
    names = sorted(p.name for p in run_dir.iterdir())
    if MARKER_NAME not in names:
        return [name for name in names if name != LOCK_NAME]
    foreign = []
    for name in names:
        path = run_dir / name
        if name in OWN_FOLDER_ENTRIES and path.is_dir() and not path.is_symlink():
            own = OWN_FOLDER_ENTRIES[name]
            foreign += [f"{name}/{p.name}" for p in sorted(path.iterdir()) if not own.match(p.name)]
        elif name in OWN_FOLDER_ENTRIES:
            foreign.append(name)  # a file or link where fedshift keeps a folder
        elif name not in OWN_NAMES and not OWN_TEMP_FILE.match(name):
            if not is_fedshift_figure(path):
                foreign.append(name)
    return foreign


def clear_run_dir(run_dir: Path) -> None:
    """Empty a claimed run directory, keeping its lock and marker; refuses (ConfigError) a
    folder holding anything fedshift did not write, so nothing of a user's is deleted."""
    foreign = foreign_entries(run_dir)
    if foreign:
        raise ConfigError(not_a_run_dir(run_dir, foreign))
    for path in run_dir_contents(run_dir):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            os.remove(path)


def not_a_run_dir(run_dir: Path, foreign: list[str]) -> str:
    """The one-line refusal of a folder that is not provably a fedshift run directory."""
    shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
    if not (Path(run_dir) / MARKER_NAME).exists():
        return (
            f"--out {run_dir} is not a fedshift run directory (it has no {MARKER_NAME} marker "
            f"and holds {shown}); nothing was changed: give a new or empty folder"
        )
    return (
        f"--out {run_dir} is not a fedshift run directory (it holds {shown}, which fedshift "
        "did not write); nothing was changed: move those out, or give a new or empty folder"
    )


def refuse_foreign(run_dir: Path) -> None:
    """Refuse (ConfigError, touching nothing) an existing folder that holds anything fedshift
    did not write, checkpoint or not: a run is started again, resumed or cleared only in a
    folder that is provably its own, so a user's file beside a run is never lost."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    foreign = foreign_entries(run_dir)
    if foreign:
        raise ConfigError(not_a_run_dir(run_dir, foreign))


def never_checkpointed(run_dir: Path) -> bool:
    """A fedshift run that stopped before its first checkpoint: its marker and
    ``config.json`` are there, nothing but a run's own files, no checkpoint and no summary.
    Nothing in it is worth keeping."""
    files = RunFiles(run_dir)
    return (
        files.config.is_file()
        and not foreign_entries(run_dir)
        and not files.has_checkpoint()
        and not files.summary.exists()
    )


def unwritable_ancestor(path: Path) -> str | None:
    """Why ``path`` cannot be created or written: its nearest existing ancestor is a file
    or is not writable; None when it can."""
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} cannot be written"
    return None


def check_run_dir(run_dir: Path, *, resume: bool) -> None:
    """Refuse an unusable ``--out`` before any work and without touching it."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"--out {run_dir} is a file, not a folder; give a folder for the run")
    problem = unwritable_ancestor(run_dir)
    if problem is not None:
        suffix = " (read-only)" if problem.endswith("cannot be written") else ""
        raise ConfigError(f"--out {run_dir}: {problem}{suffix}")
    if not run_dir.is_dir():
        if resume:
            raise CheckpointError(f"cannot resume: no {CHECKPOINT} in {run_dir}")
        return
    contents = run_dir_contents(run_dir)
    if RunFiles(run_dir).config.is_file() or RunFiles(run_dir).has_checkpoint():
        refuse_foreign(run_dir)
    if resume:
        if not RunFiles(run_dir).has_checkpoint() and not never_checkpointed(run_dir):
            raise CheckpointError(f"cannot resume: no {CHECKPOINT} in {run_dir}")
    elif contents and not never_checkpointed(run_dir):
        raise ConfigError(
            f"run directory {run_dir} is not empty; use --resume to continue it or another --out"
        )


def settle_run_dir(run_dir: Path, *, resume: bool) -> bool:
    """Under the run's lock: remove a killed writer's temp files and clear a run that never
    reached its first checkpoint. Returns whether to resume from a checkpoint."""
    check_run_dir(run_dir, resume=resume)  # again: another process may have written meanwhile
    for path in run_dir_contents(run_dir):
        if path.is_file() and OWN_TEMP_FILE.match(path.name):
            path.unlink()
    if never_checkpointed(run_dir):
        log.warning(
            "run directory %s holds a run that stopped before its first checkpoint; "
            "starting it again from round 1",
            run_dir,
        )
        clear_run_dir(run_dir)
        return False
    return RunFiles(run_dir).resumes(resume)
