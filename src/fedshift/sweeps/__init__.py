"""Algorithms × targets × seeds × a hyperparameter grid, one run directory each; resumable,
in this process, in parallel worker processes, or as Ray tasks.

A sweep is planned whole before the first run: every configuration is resolved by
:func:`fedshift.config.resolve` (the path of ``fedshift run --set``), so a bad name, key or
value fails at once. Each run then claims its run directory (one writer per directory), so
two sweeps of the same plan share its runs, and running the same sweep again reads finished
runs back, resumes interrupted ones from their checkpoints and starts the rest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedshift.core.errors import ConfigError, RunInterrupted, did_you_mean
from fedshift.core.runfiles import MARKER_NAME, RunFiles
from fedshift.engine.run.rundir import unwritable_ancestor
from fedshift.sweeps.execute import RunOutcome, finished_summary
from fedshift.sweeps.launchers import LAUNCHERS
from fedshift.sweeps.planning import check_picklable, parse_grid, plan
from fedshift.sweeps.progress import SweepProgress

__all__ = ["SweepFailed", "SweepSummaries", "parse_grid", "plan", "sweep"]


class SweepSummaries(list):
    """The summaries of a sweep's finished runs in plan order, with their run directories
    (``run_dirs``) and the runs that failed (``failed``: ``(run directory, message)``)."""

    def __init__(self, summaries=(), run_dirs=(), failed=()):
        super().__init__(summaries)
        self.run_dirs: list[Path] = list(run_dirs)
        self.failed: list[tuple[Path, str]] = list(failed)


class SweepFailed(RuntimeError):
    """Some runs of a sweep failed (the others finished): ``failed`` lists
    ``(run directory, message)``, ``results`` the finished runs."""

    def __init__(self, failed: list[tuple[Path, str]], results: list[Any]) -> None:
        names = ", ".join(f"{path.name} ({message})" for path, message in failed)
        super().__init__(f"{len(failed)} run(s) of the sweep failed: {names}")
        self.failed = failed
        self.results = results


def sweep(
    algorithms: list[str],
    targets: list[str],
    seeds: list[int],
    out: str | Path,
    *,
    config_file: str | None = None,
    flags: dict[str, Any] | None = None,
    sets: list[str] | None = None,
    grid: dict[str, list[Any]] | list[str] | None = None,
    jobs: int | None = None,
    devices: list[str] | None = None,
    backend: str = "local",
    progress: bool = True,
    random_trials: int = 0,
    random_seed: int = 0,
) -> SweepSummaries:
    """Run every combination (× every grid point) into ``out``; see :func:`run_name`.

    Finished runs (with ``summary.json``) are read back, interrupted ones (with a checkpoint)
    are resumed, the rest start fresh — so re-running the same sweep continues it. A run
    another process is writing is skipped. A run that fails is reported in one line and the
    sweep goes on; the result lists it in ``failed``. Every configuration is resolved before
    the first run, so a bad name, grid key or value fails before any work. ``random_trials``
    replaces the grid by a seeded random search (``--random N``, see :func:`plan`).

    ``jobs`` runs at once: 1 (default for ``local``) runs in this process; more run in
    spawned worker processes; with ``backend="ray"`` each run is a Ray task (default: all
    submitted, Ray schedules them). ``devices`` (``["cuda:0", "cuda:1"]``) are given to the
    runs round-robin; several runs may share a GPU.
    """
    check_choice_backend(backend)
    launcher = LAUNCHERS[backend]
    launcher.check()
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {jobs}")
    parallel = launcher.parallel(jobs)
    check_out(Path(out))
    runs = plan(
        algorithms,
        targets,
        seeds,
        out,
        config_file=config_file,
        flags=flags,
        sets=sets,
        grid=grid,
        devices=devices,
        jobs=jobs or launcher.default_jobs(),
        random_trials=random_trials,
        random_seed=random_seed,
    )
    if parallel:
        check_picklable(runs)
    outcomes: dict[int, RunOutcome] = {}
    pending = []
    for index, run in enumerate(runs, start=1):
        done, run = finished_summary(run)
        if done is not None:
            outcomes[index] = RunOutcome("done", done)
        else:
            pending.append((index, run))
    report = SweepProgress(len(runs), len(outcomes), enabled=progress, parallel=parallel)
    if pending and (outcomes or parallel):
        how = f" ({backend}, jobs {jobs or 'as the backend schedules'})" if parallel else ""
        report.line(
            f"sweep: {len(runs)} runs, {len(outcomes)} finished earlier, {len(pending)} to run"
            + how
        )
    try:
        if pending:
            outcomes.update(launcher.launch(pending, jobs, devices, report, progress))
    except KeyboardInterrupt as stop:
        report.close()
        if isinstance(stop, RunInterrupted):
            raise
        raise RunInterrupted(Path(out), True) from None
    report.close()
    result = SweepSummaries()
    for index, run in enumerate(runs, start=1):
        outcome = outcomes[index]
        if outcome.status == "done":
            result.append(outcome.summary)
            result.run_dirs.append(run.run_dir)
        elif outcome.status == "failed":
            result.failed.append((run.run_dir, outcome.message))
    return result


def check_out(out: Path) -> None:
    """The sweep's folder must be a folder, or creatable, and not a run directory (its runs
    would nest inside another run); checked before any run."""
    problem = unwritable_ancestor(out)
    if problem is not None:
        raise ConfigError(f"cannot use --out {out}: {problem}")
    files = RunFiles(out)
    if (out / MARKER_NAME).exists():
        raise ConfigError(
            f"cannot use --out {out}: it is a run directory (of `fedshift run`); give the "
            "sweep a folder of its own"
        )
    found = [p.name for p in (files.config, files.checkpoint) if p.exists()]
    if found or files.has_checkpoint():
        raise ConfigError(
            f"cannot use --out {out}: it holds {', '.join(found) or 'a checkpoint'}, which "
            "fedshift did not write there for a sweep; nothing was changed: give the sweep a "
            "folder of its own"
        )


def check_choice_backend(backend: str) -> None:
    if backend not in LAUNCHERS:
        raise ConfigError(
            f"unknown backend {backend!r}{did_you_mean(backend, LAUNCHERS)}; "
            f"choose one of: {', '.join(LAUNCHERS)}"
        )
