"""One planned run under its run directory's lock: read back, resumed or started."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from fedshift.core.errors import FedshiftError
from fedshift.core.runfiles import RunFiles
from fedshift.engine.run.rundir import (
    RunDirectoryBusy,
    claim_run_dir,
    clear_run_dir,
    refuse_foreign,
)
from fedshift.engine.run.runner import run_experiment
from fedshift.sweeps.planning import PlannedRun


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """What became of one planned run: ``done`` (ran now or earlier), ``busy`` (another
    process writes it) or ``failed`` (``message`` says why, in one line)."""

    status: str
    summary: dict[str, Any] | None = None
    message: str = ""
    seconds: float = 0.0
    resumed: bool = False


def finished_summary(run: PlannedRun) -> tuple[dict[str, Any] | None, PlannedRun]:
    """The run's summary if it finished earlier and records its grid point, else None and
    the run to execute (told not to read a half-written summary again: one warning)."""
    if not RunFiles(run.run_dir).summary.exists():
        return None, run
    summary = RunFiles(run.run_dir).read_summary()  # None (with a warning) when half-written
    if summary is None:
        return None, dataclasses.replace(run, read_back=False)
    if run.grid and summary.get("grid") != run.grid:
        return None, run  # finished, its grid point to be recorded under the lock
    return summary, run


def with_grid(run: PlannedRun, summary: dict[str, Any]) -> dict[str, Any]:
    """The summary with the run's grid point (written back to ``summary.json`` once)."""
    if not run.grid or summary.get("grid") == run.grid:
        return summary
    summary = {**summary, "grid": run.grid}
    RunFiles(run.run_dir).write_summary(summary)
    return summary


def one_line(exc: BaseException) -> str:
    """An exception as one line; the type is named unless it is one of fedshift's errors."""
    text = " ".join(str(exc).split()) or "(no message)"
    if isinstance(exc, FedshiftError):
        return text
    return f"{type(exc).__name__}: {text}"


def execute(run: PlannedRun, progress: bool = False) -> RunOutcome:
    """Run (or resume, or read back) one planned run under its run directory's lock.

    Any error of the run becomes a ``failed`` outcome, so a sweep goes on with the next;
    Ctrl-C (:class:`RunInterrupted`) is passed on.
    """
    start = time.perf_counter()
    run_dir = run.run_dir
    try:
        files = RunFiles(run_dir)
        if not (run.read_back and files.summary.exists()):
            refuse_foreign(run_dir)  # before the claim adds its lock file
        with claim_run_dir(run_dir):
            found = run.read_back and files.summary.exists()
            done = files.read_summary() if found else None
            if done is not None:  # finished earlier, or by another sweep meanwhile
                return RunOutcome("done", with_grid(run, done))
            resume = files.resumes()
            if not resume:
                clear_run_dir(run_dir)  # killed before its first checkpoint
            summary, _ = run_experiment(run.cfg, run_dir, resume=resume, progress=progress)
            summary = with_grid(run, summary)
            return RunOutcome("done", summary, seconds=time.perf_counter() - start, resumed=resume)
    except RunDirectoryBusy:
        return RunOutcome("busy", message="another process runs it; skipped")
    except Exception as exc:  # noqa: BLE001 - one failed run must not end the sweep
        return RunOutcome("failed", message=one_line(exc), seconds=time.perf_counter() - start)
