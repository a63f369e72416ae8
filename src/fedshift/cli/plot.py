"""``fedshift plot tsne|curves``: figures from run directories."""

from __future__ import annotations

import argparse

from fedshift.cli.errors import ArgumentParser, Command, add_force_flag
from fedshift.cli.run import add_allow_imports_flag


def add_arguments(parser: argparse.ArgumentParser) -> None:
    figures = parser.add_subparsers(dest="figure", parser_class=ArgumentParser, required=True)
    tsne = figures.add_parser(
        "tsne", help="t-SNE of client features, coloured by class, global prototypes marked"
    )
    tsne.add_argument("run_dir", help="a run directory (config.json + checkpoint.pt)")
    tsne.add_argument(
        "--out", help="figure file (.png, .pdf, .svg, .jpg; default RUN_DIR/tsne.png)"
    )
    add_force_flag(tsne)
    add_allow_imports_flag(tsne, "the run's config.json")
    tsne.add_argument("--per-client", type=int, default=100, dest="per_client")
    tsne.add_argument(
        "--with-target",
        action="store_true",
        dest="with_target",
        help="also embed the held-out target domain's test split (its own marker)",
    )
    curves = figures.add_parser(
        "curves", help="per-round curves, one line per config with mean ± std over seeds"
    )
    curves.add_argument("run_dirs", nargs="+", help="run directories or folders holding them")
    curves.add_argument(
        "--out", required=True, help="figure file to write (.png, .pdf, .svg, .jpg)"
    )
    add_force_flag(curves)
    curves.add_argument(
        "--metric",
        default="target_accuracy",
        help="a metrics.jsonl key, e.g. train_loss or per_domain_accuracy/mnist "
        "(default target_accuracy)",
    )


def run(args: argparse.Namespace) -> int:
    from fedshift.core.outputs import FIGURE, check_output

    if args.figure == "curves":
        from fedshift.report.curves import find_run_dirs, plot_curves

        check_output(args.out, FIGURE, "--out", force=args.force)
        path = plot_curves(
            find_run_dirs(args.run_dirs), args.out, args.metric, flag="--out", force=args.force
        )
    else:
        from fedshift.report.tsne import plot_tsne

        path = plot_tsne(
            args.run_dir,
            args.out,
            per_client=args.per_client,
            with_target=args.with_target,
            force=args.force,
            allow_imports=args.allow_imports,
        )
    print(f"wrote {path}")
    return 0


COMMAND = Command("plot", "figures from run directories", add_arguments, run)
