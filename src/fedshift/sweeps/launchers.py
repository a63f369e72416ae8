"""Where a sweep's runs execute: in this process, in worker processes, or as Ray tasks."""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from fedshift.core.errors import ConfigError, RunInterrupted
from fedshift.core.runfiles import RunFiles
from fedshift.sweeps.execute import RunOutcome, execute, one_line
from fedshift.sweeps.planning import PlannedRun
from fedshift.sweeps.progress import SweepProgress


def _worker_setup() -> None:
    """A worker process reports warnings as the CLI does."""
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")


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


@dataclasses.dataclass(frozen=True)
class Launcher:
    """A sweep backend: ``check()`` before planning (a missing package is a one-line
    ConfigError), whether ``jobs`` runs go in parallel, ``default_jobs()`` (how many runs the
    CPU threads are divided among when ``--jobs`` is not given), ``launch(pending, jobs,
    devices, report, progress)`` returning each run's outcome by index, and its ``help``
    (``fedshift sweep --help``)."""

    check: Callable[[], Any]
    parallel: Callable[[int | None], bool]
    launch: Callable[..., dict[int, RunOutcome]]
    default_jobs: Callable[[], int]
    help: str


def launch_local(pending, jobs, devices, report: SweepProgress, progress: bool):
    """In this process (``jobs`` 1) or in ``jobs`` worker processes."""
    if (jobs or 1) > 1:
        return run_processes(pending, jobs, report)
    return run_sequential(pending, report, progress)


def launch_ray(pending, jobs, devices, report: SweepProgress, progress: bool):
    """Ray tasks; runs on the CUDA ``devices`` share each GPU evenly."""
    cuda = [d for d in devices or [] if d.startswith("cuda")]
    per_gpu = math.ceil((jobs or len(pending)) / len(cuda)) if cuda else 1
    return run_ray(pending, jobs, report, 1 / per_gpu)


#: backend name (``--backend``) -> its launcher; adding a backend is one function and one line
LAUNCHERS: dict[str, Launcher] = {
    "local": Launcher(
        check=lambda: None,
        parallel=lambda jobs: (jobs or 1) > 1,
        launch=launch_local,
        default_jobs=lambda: 1,
        help="this process (jobs 1) or spawned worker processes",
    ),
    "ray": Launcher(
        check=check_ray_backend,
        parallel=lambda jobs: True,
        launch=launch_ray,
        # without --jobs every run is submitted; one thread each (unless set), Ray fills the CPUs
        default_jobs=lambda: os.cpu_count() or 1,
        help="one Ray task per run (pip install 'fedshift[ray]'; joins $RAY_ADDRESS when set)",
    ),
}
