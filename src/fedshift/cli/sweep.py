"""``fedshift sweep``: algorithms x targets x seeds x a hyperparameter grid or random search,
resumable."""

from __future__ import annotations

import argparse
import sys

from fedshift.cli.errors import Command
from fedshift.cli.flags import add_run_flags, flag_values
from fedshift.cli.run import csv
from fedshift.core.errors import ConfigError, RunInterrupted


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from fedshift.sweeps.launchers import LAUNCHERS  # the engine: only when sweep is parsed

    parser.add_argument("-a", "--algorithms", required=True, help="comma-separated algorithms")
    parser.add_argument("-t", "--targets", required=True, help="comma-separated target domains")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    add_run_flags(parser, sweep=True)
    parser.add_argument("--out", required=True, help="folder for the run directories")
    parser.add_argument("--config", help="TOML file applied to every run")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="sweep a run key or algo.<hyperparameter> over values, crossed with the others, "
        "e.g. --grid algo.mu=0.001,0.01 --grid lr=0.01,0.05 "
        "(run directories ALGO-TARGET-sSEED@KEY=V,...)",
    )
    parser.add_argument(
        "--random",
        type=int,
        default=0,
        metavar="N",
        help="instead of --grid, a seeded random search: N points per algorithm (the first "
        "its defaults), drawing lr, weight_decay and each hyperparameter with a search "
        "distribution (`fedshift show ALGO`); keys fixed by --set are not drawn",
    )
    parser.add_argument(
        "--random-seed",
        type=int,
        default=0,
        help="seed of the random search's draws (default 0)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        help="runs at once (default 1; with --backend ray: all, as Ray schedules them); "
        "each gets max(1, cores // jobs) CPU threads unless threads is set",
    )
    parser.add_argument(
        "--devices", help="comma-separated devices given to runs round-robin, e.g. cuda:0,cuda:1"
    )
    parser.add_argument(
        "--backend",
        choices=list(LAUNCHERS),
        default="local",
        help="; ".join(f"{name}: {launcher.help}" for name, launcher in LAUNCHERS.items()),
    )
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print the planned runs (name, what the sweep would do, the main settings) and "
        "exit without running or writing anything; every configuration is still checked",
    )


def run(args: argparse.Namespace) -> int:
    from fedshift.report.aggregate import markdown, table
    from fedshift.report.selection import has_grid, selection_markdown
    from fedshift.sweeps import sweep

    try:
        seeds = [int(s) for s in csv(args.seeds)]
    except ValueError:
        raise ConfigError(f"--seeds expects integers, got {args.seeds!r}") from None
    algorithms = csv(args.algorithms)
    if args.dry_run:
        return print_plan(args, algorithms, seeds)
    positional, options = planned_runs(args, algorithms, seeds)
    summaries = sweep(
        *positional, **options, jobs=args.jobs, backend=args.backend, progress=not args.quiet
    )
    if summaries:
        if has_grid(summaries):
            print(selection_markdown(summaries, rows=algorithms))
        else:
            print(markdown(*table(summaries, rows=algorithms)))
    if summaries.failed:
        print(
            f"fedshift: {len(summaries.failed)} of {len(summaries) + len(summaries.failed)} "
            f"runs failed: {', '.join(path.name for path, _ in summaries.failed)}; fix the "
            "cause and run the same sweep again (finished runs are kept)",
            file=sys.stderr,
        )
        return 1
    return 0


def planned_runs(
    args: argparse.Namespace, algorithms: list[str], seeds: list[int]
) -> tuple[tuple, dict]:
    """What a sweep and its ``--dry-run`` plan from the command line: the positional
    arguments and the options both take (one place, so the plan is the sweep's)."""
    positional = (algorithms, csv(args.targets), seeds, args.out)
    options = {
        "config_file": args.config,
        "flags": flag_values(args, sweep=True),
        "sets": args.set,
        "grid": args.grid,
        "devices": csv(args.devices) if args.devices else None,
        "random_trials": args.random,
        "random_seed": args.random_seed,
    }
    return positional, options


def planned_status(run_dir) -> str:
    """What running the sweep would do with ``run_dir``: read it back, resume it or start it."""
    from fedshift.core.runfiles import RunFiles

    files = RunFiles(run_dir)
    if files.summary.is_file():
        return "finished"
    return "resume" if files.has_checkpoint() else "start"


def print_plan(args: argparse.Namespace, algorithms: list[str], seeds: list[int]) -> int:
    """``--dry-run``: plan the sweep (every configuration resolved and checked) and print
    one line per run; nothing is run or written."""
    from fedshift.sweeps import plan

    positional, options = planned_runs(args, algorithms, seeds)
    runs = plan(*positional, **options, jobs=args.jobs or 1)
    counts: dict[str, int] = {}
    for run in runs:
        status = planned_status(run.run_dir)
        counts[status] = counts.get(status, 0) + 1
        cfg = run.cfg
        grid = " ".join(f"{k}={v}" for k, v in run.grid.items())
        print(
            f"{status:8} {run.name}  algorithm={cfg.algorithm} target={cfg.target} "
            f"seed={cfg.seed} rounds={cfg.rounds} {grid}".rstrip()
        )
    done = ", ".join(f"{n} {status}" for status, n in counts.items())
    print(f"sweep --dry-run: {len(runs)} runs planned ({done}) in {args.out}; nothing was run")
    return 0


def interrupted(args: argparse.Namespace, stop: RunInterrupted) -> str:
    return f" in {stop.run_dir}; run the same sweep again to continue it"


COMMAND = Command(
    "sweep",
    "algorithms x targets x seeds x a hyperparameter grid (resumable, parallel)",
    add_arguments,
    run,
    interrupted,
)
