"""Algorithms × targets × seeds, one run directory each; resumable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedshift.config import resolve
from fedshift.core.state import has_checkpoint
from fedshift.engine.rundir import RunDirectoryBusy, claim_run_dir, clear_run_dir, read_summary
from fedshift.engine.runner import run_experiment


def sweep(
    algorithms: list[str],
    targets: list[str],
    seeds: list[int],
    out: str | Path,
    *,
    config_file: str | None = None,
    flags: dict[str, Any] | None = None,
    sets: list[str] | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Run every combination into ``out/<algo>-<target>-s<seed>``.

    Finished runs (with ``summary.json``) are read back, interrupted ones (with a checkpoint)
    are resumed, the rest start fresh — so re-running the same sweep continues it. A run
    another process is writing is skipped, so two sweeps of the same plan share its runs.
    Every configuration is resolved before the first run, so a bad name fails before any
    work.
    """
    out = Path(out)
    plan = []
    for algorithm in algorithms:
        for target in targets:
            for seed in seeds:
                cfg = resolve(
                    config_file,
                    {**(flags or {}), "algorithm": algorithm, "target": target, "seed": seed},
                    list(sets or []),
                )
                plan.append((cfg, out / f"{algorithm}-{target}-s{seed}"))
    summaries = []
    for i, (cfg, run_dir) in enumerate(plan, start=1):
        had_summary = (run_dir / "summary.json").exists()
        done = read_summary(run_dir) if had_summary else None  # None (warned): half-written
        if done is not None:
            summaries.append(done)
            continue
        try:
            with claim_run_dir(run_dir):
                # finished by another sweep meanwhile
                done = None if had_summary else read_summary(run_dir)
                if done is not None:
                    summaries.append(done)
                    continue
                resume = has_checkpoint(run_dir)
                if not resume:
                    clear_run_dir(run_dir)  # killed before its first checkpoint
                if progress:
                    note = " (resuming)" if resume else ""
                    print(f"[{i}/{len(plan)}] {run_dir.name}{note}", flush=True)
                summary, _ = run_experiment(cfg, run_dir, resume=resume, progress=progress)
                summaries.append(summary)
        except RunDirectoryBusy:
            print(f"[{i}/{len(plan)}] {run_dir.name}: another process runs it; skipped", flush=True)
    return summaries
