"""The ``fedshift`` command line: one module per command, one table of run flags
(:mod:`fedshift.cli.flags`) and one error handler (:mod:`fedshift.cli.errors`).

Adding a command is one module defining ``COMMAND`` plus one line in :data:`COMMANDS`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from fedshift.cli import datasets, list_, plot, pretrain, report, run, show, sweep
from fedshift.cli.errors import ArgumentParser, run_command
from fedshift.core.version import __version__

COMMANDS = (
    run.COMMAND,
    sweep.COMMAND,
    report.COMMAND,
    list_.COMMAND,
    show.COMMAND,
    datasets.COMMAND,
    plot.COMMAND,
    pretrain.COMMAND,
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; each subparser records its command in ``command``."""
    parser = ArgumentParser(
        prog="fedshift",
        description="Federated learning under domain shift. With no arguments, `fedshift run` "
        "trains FedAvg on the embedded digits-dg benchmark, target mnistm.",
    )
    parser.add_argument("--version", action="version", version=f"fedshift {__version__}")
    commands = parser.add_subparsers(dest="name", parser_class=ArgumentParser, required=True)
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help)
        command.add_arguments(sub)
        sub.set_defaults(command=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``fedshift ARGV`` (no arguments: ``fedshift run``); the exit code."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv or ["run"])
    return run_command(args.command, args)


__all__ = ["COMMANDS", "build_parser", "main"]
