"""Algorithms × targets × seeds × a hyperparameter grid, one run directory each; resumable,
in this process, in parallel worker processes, or as Ray tasks.

A sweep is planned whole before the first run: every configuration is resolved by
:func:`fedshift.config.resolve` (the path of ``fedshift run --set``), so a bad name, key or
value fails at once. Each run then claims its run directory (one writer per directory), so
two sweeps of the same plan share its runs, and running the same sweep again reads finished
runs back, resumes interrupted ones from their checkpoints and starts the rest.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import multiprocessing
import os
import re
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from fedshift.algorithms import REGISTRY, get_algorithm, origin_of
from fedshift.config import parse_set, renamed, resolve
from fedshift.core.errors import ConfigError, RunInterrupted, did_you_mean
from fedshift.core.hparams import hparam_types
from fedshift.core.runconfig import RunConfig, check_choice_device
from fedshift.core.runfiles import RunFiles
from fedshift.data.custom import registered_datasets
from fedshift.engine.assembly import resolve_device
from fedshift.engine.run.rundir import (
    RunDirectoryBusy,
    claim_run_dir,
    clear_run_dir,
    refuse_foreign,
    unwritable_ancestor,
)
from fedshift.engine.run.runner import run_experiment

#: run keys a sweep takes from its own options, not from ``--grid``
SWEEP_OPTIONS = {"algorithm": "-a/--algorithms", "target": "-t/--targets", "seed": "--seeds"}
BACKENDS = ("local", "ray")
#: characters kept as they are when a grid value becomes part of a directory name
UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9._=+:-]")


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One run of a sweep: its resolved config, run directory and grid point."""

    cfg: RunConfig
    run_dir: Path
    #: grid key -> the resolved value of this run (empty without a grid)
    grid: dict[str, Any]
    #: read a summary found under the lock (False: the sweep found it half-written already)
    read_back: bool = True

    @property
    def name(self) -> str:
        return self.run_dir.name


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """What became of one planned run: ``done`` (ran now or earlier), ``busy`` (another
    process writes it) or ``failed`` (``message`` says why, in one line)."""

    status: str
    summary: dict[str, Any] | None = None
    message: str = ""
    seconds: float = 0.0
    resumed: bool = False


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


def parse_grid(items: list[str] | dict[str, Any] | None) -> dict[str, list[Any]]:
    """``--grid KEY=v1,v2`` items (or a ``{key: [values]}`` dict) as ``{key: [values]}``.

    Keys are checked against the sweep's own options and each other here; whether each key
    and value is valid is checked by :func:`plan`, through the run config's resolver.
    """
    if not items:
        return {}
    if isinstance(items, dict):
        pairs = [(k, list(v) if isinstance(v, list | tuple) else [v]) for k, v in items.items()]
    else:
        pairs = []
        for item in items:
            key, sep, values = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"--grid expects KEY=v1,v2,..., got {item!r}")
            pairs.append((key.strip(), [v.strip() for v in values.split(",") if v.strip()]))
    grid: dict[str, list[Any]] = {}
    for key, values in pairs:
        key = key if key.startswith("algo.") else renamed(key)
        if key in SWEEP_OPTIONS:
            raise ConfigError(
                f"--grid {key}: sweep {key}s with {SWEEP_OPTIONS[key]}, not with --grid"
            )
        if key in grid:
            raise ConfigError(f"--grid {key} is given twice; give its values once, comma-separated")
        if not values:
            raise ConfigError(f"--grid {key} has no values; give KEY=v1,v2,...")
        grid[key] = values
    return grid


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values (one empty point without a grid)."""
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*grid.values())]


def applicable(point: dict[str, Any], algorithm: str, grid_keys_known: set[str]) -> dict:
    """The part of a grid point that applies to ``algorithm``: an ``algo.NAME`` key that
    the algorithm has no hyperparameter for is left out when another algorithm of the sweep
    has it (``--grid algo.mu=...`` with ``-a fedavg,fedprox`` varies FedProx only)."""
    names = set(hparam_types(REGISTRY[algorithm].Hparams))
    return {
        k: v
        for k, v in point.items()
        if not k.startswith("algo.") or k[5:] in names or k not in grid_keys_known
    }


def resolved_value(cfg: RunConfig, key: str) -> Any:
    """The value of a grid key in a resolved config (``algo.NAME`` or a run key)."""
    return cfg.algo[key[5:]] if key.startswith("algo.") else getattr(cfg, key)


def value_text(value: Any) -> str:
    """A resolved value as it appears in a run directory's name (``0.01``, ``1e-05``)."""
    text = repr(value) if isinstance(value, float) else str(value)
    return UNSAFE_IN_NAME.sub("_", text)


def run_name(algorithm: str, target: str, seed: int, point: dict[str, Any]) -> str:
    """``fedprox-mnistm-s0`` without a grid (the names of sweeps before grids), else
    ``fedprox-mnistm-s0@algo.mu=0.01,lr=0.05`` (grid keys sorted, resolved values)."""
    base = f"{algorithm}-{target}-s{seed}"
    if not point:
        return base
    return base + "@" + ",".join(f"{k}={value_text(point[k])}" for k in sorted(point))


def check_devices(devices: list[str]) -> list[str]:
    """``--devices`` names, each a valid and present device (``cpu``, ``cuda``, ``cuda:N``)."""
    for device in devices:
        check_choice_device(device)
        resolve_device(device)  # ConfigError when CUDA or that GPU is missing
    return list(devices)


def plan(
    algorithms: list[str],
    targets: list[str],
    seeds: list[int],
    out: str | Path,
    *,
    config_file: str | None = None,
    flags: dict[str, Any] | None = None,
    sets: list[str] | None = None,
    grid: dict[str, list[Any]] | list[str] | None = None,
    devices: list[str] | None = None,
    jobs: int = 1,
) -> list[PlannedRun]:
    """Every run of the sweep, resolved and checked (ConfigError before any work).

    Grid values override ``flags``; a grid key also given in ``sets`` (``--set``) or as a
    flag is an error, as is a grid point no algorithm of the sweep uses. ``devices`` are
    given round-robin in plan order. With ``jobs`` > 1 a run whose ``threads`` is unset gets
    ``max(1, cores // jobs)`` CPU threads, so parallel runs do not oversubscribe the cores.
    """
    out = Path(out).absolute()
    grid = parse_grid(grid)
    flags = {k if k.startswith("algo.") else renamed(k): v for k, v in (flags or {}).items()}
    given = {k if k.startswith("algo.") else renamed(k) for k in parse_set(list(sets or []))}
    given |= {k for k, v in flags.items() if v is not None}
    for key in grid:
        if key in given:
            raise ConfigError(f"{key} is given both in --grid and as a fixed setting; keep one")
    if devices and "device" in grid:
        raise ConfigError("device is given both in --grid and --devices; keep one")
    devices = check_devices(devices) if devices else []
    for algorithm in algorithms:
        get_algorithm(algorithm)  # unknown name: ConfigError with did-you-mean
    known = {
        k
        for k in grid
        if k.startswith("algo.")
        and any(k[5:] in hparam_types(REGISTRY[a].Hparams) for a in algorithms)
    }
    for key in grid:
        if key.startswith("algo.") and key not in known:
            names = sorted({n for a in algorithms for n in hparam_types(REGISTRY[a].Hparams)})
            raise ConfigError(
                f"--grid {key}: no algorithm of the sweep ({', '.join(algorithms)}) has "
                f"hyperparameter {key[5:]!r}{did_you_mean(key[5:], names)}; theirs: "
                f"{', '.join(f'algo.{n}' for n in names) or '(none)'}"
            )
    threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else 0
    planned: list[PlannedRun] = []
    names: dict[str, dict[str, Any]] = {}
    for algorithm in algorithms:
        for target in targets:
            for seed in seeds:
                for point in grid_points(grid):
                    point = applicable(point, algorithm, known)
                    settings = {**flags, **point, "algorithm": algorithm}
                    settings.update(target=target, seed=seed)
                    cfg = resolve(config_file, settings, list(sets or []))
                    values = {k: resolved_value(cfg, k) for k in point}
                    name = run_name(algorithm, target, seed, values)
                    if name in names:
                        if names[name] != cfg.to_dict():
                            raise ConfigError(
                                f"two grid points of the sweep both name run {name}; "
                                "give grid values that differ once written in a folder name"
                            )
                        continue  # the same run again (a grid key this algorithm lacks)
                    names[name] = cfg.to_dict()
                    if devices:
                        cfg = dataclasses.replace(cfg, device=devices[len(planned) % len(devices)])
                    if threads and cfg.threads == 0:
                        cfg = dataclasses.replace(cfg, threads=threads)
                    planned.append(PlannedRun(cfg, out / name, values))
    return planned


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
    if type(exc).__module__.startswith("fedshift."):
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


def _worker_setup() -> None:
    """A worker process reports warnings as the CLI does."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


class SweepProgress:
    """The sweep's progress: one line per started (sequential) and per finished run, with
    its target accuracy; with parallel runs on a terminal, a bar of finished/running/left."""

    def __init__(self, total: int, earlier: int, *, enabled: bool, parallel: bool) -> None:
        self.total = total
        self.finished = earlier
        self.enabled = enabled
        self.bar = None
        if enabled and parallel and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=earlier, desc="sweep", unit="run", leave=False)

    def line(self, text: str, *, always: bool = False) -> None:
        if not (self.enabled or always):
            return
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def started(self, run: PlannedRun, index: int, resuming: bool) -> None:
        note = " (resuming)" if resuming else ""
        self.line(f"[{index}/{self.total}] {run.name}{note}")

    def ended(self, run: PlannedRun, outcome: RunOutcome, running: int) -> None:
        self.finished += 1
        left = self.total - self.finished - running
        counts = f"finished {self.finished}/{self.total}, running {running}, left {left}"
        if outcome.status == "failed":
            self.line(f"{run.name}: FAILED: {outcome.message} ({counts})", always=True)
        elif outcome.status == "busy":
            self.line(f"{run.name}: {outcome.message} ({counts})", always=True)
        else:
            self.line(f"{run.name}: {accuracy_text(outcome)} ({counts})")
        if self.bar is not None:
            self.bar.set_postfix(running=running, left=left)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def accuracy_text(outcome: RunOutcome) -> str:
    summary = outcome.summary or {}
    value = summary.get("target_accuracy", summary.get("personalized_accuracy"))
    took = f" in {outcome.seconds:.1f}s" if outcome.seconds else ""
    if isinstance(value, int | float) and not math.isnan(value):
        return f"target accuracy {100 * value:.1f}%{took}"
    return f"done{took}"


def run_sequential(pending, report: SweepProgress, progress: bool) -> dict[int, RunOutcome]:
    outcomes = {}
    for index, run in pending:
        report.started(run, index, RunFiles(run.run_dir).resumes())
        outcomes[index] = execute(run, progress)
        report.ended(run, outcomes[index], running=0)
    return outcomes


def run_processes(pending, jobs: int, report: SweepProgress) -> dict[int, RunOutcome]:
    """Runs in ``jobs`` worker processes (spawned: a fresh interpreter, no inherited CUDA
    or thread state)."""
    context = multiprocessing.get_context("spawn")
    outcomes: dict[int, RunOutcome] = {}
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=_worker_setup)
    try:
        futures = {pool.submit(execute, run): (index, run) for index, run in pending}
        waiting = set(futures)
        while waiting:
            done, waiting = wait(waiting, return_when=FIRST_COMPLETED)
            for future in done:
                index, run = futures[future]
                try:
                    outcomes[index] = future.result()
                except (BrokenProcessPool, RunInterrupted, OSError) as exc:
                    outcomes[index] = RunOutcome("failed", message=one_line(exc))
                report.ended(run, outcomes[index], running=min(jobs, len(waiting)))
    except KeyboardInterrupt:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return outcomes


def check_ray_backend() -> Any:
    """The ``ray`` module, or a one-line ConfigError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--backend ray needs Ray, which is not installed: pip install 'fedshift[ray]'"
        ) from None
    return ray


def run_ray(pending, jobs: int | None, report: SweepProgress, gpus_per_run: float):
    """Each run as a Ray task (``num_cpus`` its threads, ``num_gpus`` its share of a GPU);
    at most ``jobs`` in flight (all when None). Uses the running Ray instance, else
    ``ray.init()`` (which joins ``$RAY_ADDRESS`` when set, else starts one locally)."""
    ray = check_ray_backend()
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=True)
    task = ray.remote(execute)
    outcomes: dict[int, RunOutcome] = {}
    queue = list(pending)
    flight: dict[Any, tuple[int, PlannedRun]] = {}
    limit = jobs or len(queue)
    try:
        while queue or flight:
            while queue and len(flight) < limit:
                index, run = queue.pop(0)
                on_gpu = run.cfg.device.startswith("cuda")
                options = {"num_cpus": max(1, run.cfg.threads)}
                if on_gpu:
                    options["num_gpus"] = gpus_per_run
                    # Ray picks the GPU and makes it the task's only visible one
                    run = dataclasses.replace(run, cfg=dataclasses.replace(run.cfg, device="cuda"))
                flight[task.options(**options).remote(run)] = (index, run)
            [ready], _ = ray.wait(list(flight), num_returns=1)
            index, run = flight.pop(ready)
            try:
                outcomes[index] = ray.get(ready)
            except ray.exceptions.RayError as exc:
                outcomes[index] = RunOutcome("failed", message=one_line(exc).splitlines()[0])
            report.ended(run, outcomes[index], running=len(flight))
    except KeyboardInterrupt:
        for ref in flight:
            ray.cancel(ref)
        raise
    return outcomes


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
) -> SweepSummaries:
    """Run every combination (× every grid point) into ``out``; see :func:`run_name`.

    Finished runs (with ``summary.json``) are read back, interrupted ones (with a checkpoint)
    are resumed, the rest start fresh — so re-running the same sweep continues it. A run
    another process is writing is skipped. A run that fails is reported in one line and the
    sweep goes on; the result lists it in ``failed``. Every configuration is resolved before
    the first run, so a bad name, grid key or value fails before any work.

    ``jobs`` runs at once: 1 (default for ``local``) runs in this process; more run in
    spawned worker processes; with ``backend="ray"`` each run is a Ray task (default: all
    submitted, Ray schedules them). ``devices`` (``["cuda:0", "cuda:1"]``) are given to the
    runs round-robin; several runs may share a GPU.
    """
    check_choice_backend(backend)
    if backend == "ray":
        check_ray_backend()
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {jobs}")
    parallel = backend == "ray" or (jobs or 1) > 1
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
        # Ray without jobs: one thread per run (unless set), Ray fills the CPUs
        jobs=jobs or ((os.cpu_count() or 1) if backend == "ray" else 1),
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
        how = f" ({backend}, jobs {jobs or 'as Ray schedules'})" if parallel else ""
        report.line(
            f"sweep: {len(runs)} runs, {len(outcomes)} finished earlier, {len(pending)} to run"
            + how
        )
    try:
        if not pending:
            pass
        elif backend == "ray":
            cuda = [d for d in devices or [] if d.startswith("cuda")]
            per_gpu = math.ceil((jobs or len(pending)) / len(cuda)) if cuda else 1
            outcomes.update(run_ray(pending, jobs, report, 1 / per_gpu))
        elif parallel:
            outcomes.update(run_processes(pending, jobs or 1, report))
        else:
            outcomes.update(run_sequential(pending, report, progress))
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
    """The sweep's folder must be a folder, or creatable (checked before any run)."""
    problem = unwritable_ancestor(out)
    if problem is not None:
        raise ConfigError(f"cannot use --out {out}: {problem}")


def check_choice_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ConfigError(
            f"unknown backend {backend!r}{did_you_mean(backend, BACKENDS)}; "
            f"choose one of: {', '.join(BACKENDS)}"
        )


def check_picklable(runs: list[PlannedRun]) -> None:
    """Worker processes import fedshift afresh: an algorithm registered in this process only
    (``fedshift.register_algorithm``) does not exist there."""
    for algorithm in {run.cfg.algorithm for run in runs}:
        if origin_of(algorithm) == "registered":
            raise ConfigError(
                f"algorithm {algorithm!r} was registered in this process, which parallel "
                "runs (--jobs > 1, --backend ray) cannot see: use jobs=1, or make it a "
                "plug-in (package.module:Class)"
            )
    for dataset in {run.cfg.dataset for run in runs}:
        if dataset in registered_datasets():
            raise ConfigError(
                f"dataset {dataset!r} was registered in this process, which parallel runs "
                "(--jobs > 1, --backend ray) cannot see: use jobs=1, a dataset folder, or a "
                "dataset plug-in"
            )
