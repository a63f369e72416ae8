"""``fedshift report``: tables (mean ± std over seeds) from run directories."""

from __future__ import annotations

import argparse
import sys

from fedshift.cli.errors import Command, add_force_flag
from fedshift.cli.run import csv
from fedshift.core.errors import ConfigError, did_you_mean


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", help="run directories or folders holding them")
    parser.add_argument(
        "--metric",
        default="target_accuracy",
        help="summary key to tabulate (default target_accuracy, source-val selected)",
    )
    parser.add_argument("--rows", help="comma-separated algorithm order")
    parser.add_argument("--format", choices=["md", "csv"], default="md")
    parser.add_argument(
        "--plot",
        help="also write per-round curves of --metric (mean ± std over seeds) to this figure "
        "(.png, .pdf, .svg, .jpg); "
        "a summary figure such as target_accuracy_last draws its per-round metric",
    )
    add_force_flag(parser, "--plot")


def run(args: argparse.Namespace) -> int:
    from fedshift.core.outputs import FIGURE, check_output
    from fedshift.report.aggregate import find_summaries
    from fedshift.report.curves import plot_curves
    from fedshift.report.experiments import report_text
    from fedshift.report.paper import paper_lines

    if args.plot:
        check_output(args.plot, FIGURE, "--plot", force=args.force)
    summaries = find_summaries(args.paths)
    if not summaries:
        raise ConfigError(f"no summary.json under {', '.join(args.paths)}")
    metrics = sorted(
        {k for s in summaries for k, v in s.items() if isinstance(v, int | float)}
        - {"seed", "rounds"}
    )
    if not metrics:
        raise ConfigError(
            f"no readable summary under {', '.join(args.paths)}: the summary.json files there "
            "hold no metrics"
        )
    if args.metric not in metrics:
        raise ConfigError(
            f"unknown --metric {args.metric!r}{did_you_mean(args.metric, metrics)}; "
            f"the summaries have: {', '.join(metrics)}"
        )
    rows = csv(args.rows) if args.rows else None
    text, notes = report_text(summaries, args.metric, rows, args.format)
    print(text)
    for note in notes:
        print(f"fedshift: {note}", file=sys.stderr)
    if args.format == "md":
        for line in paper_lines(summaries):
            print(line)
    if args.plot:
        run_dirs = [s["_run_dir"] for s in summaries]
        path = plot_curves(run_dirs, args.plot, args.metric, flag="--plot", force=args.force)
        print(f"wrote {path}")
    return 0


COMMAND = Command(
    "report",
    "tables (mean ± std over seeds) from run directories, one per kind of experiment",
    add_arguments,
    run,
)
