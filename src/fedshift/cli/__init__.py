"""The ``fedshift`` command line: one module per command, one table of run flags
(:mod:`fedshift.cli.flags`) and one error handler (:mod:`fedshift.cli.errors`).

Adding a command is one module defining ``COMMAND`` plus one line in :data:`COMMANDS`.
Only the command being run gets its arguments (some read registries that load torch), so
``fedshift --version``, ``--help``, ``list`` and ``show run`` answer before torch loads.
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


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; each subparser records its command in ``command``.
    With ``only``, the other commands get their name and help but no arguments (adding a
    command's arguments may import what it needs: the engine, the registries)."""
    parser = ArgumentParser(
        prog="fedshift",
        description="Federated learning under domain shift. With no arguments, `fedshift run` "
        "trains FedAvg on the embedded digits-dg benchmark, target mnistm.",
    )
    parser.add_argument("--version", action="version", version=f"fedshift {__version__}")
    commands = parser.add_subparsers(dest="name", parser_class=ArgumentParser, required=True)
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.help)
        if only is None or command.name == only:
            command.add_arguments(sub)
        sub.set_defaults(command=command)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run ``fedshift ARGV`` (no arguments: ``fedshift run``); the exit code."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv) or ["run"]
    first = next((arg for arg in argv if not arg.startswith("-")), "")
    args = build_parser(first).parse_args(argv)
    return run_command(args.command, args)


__all__ = ["COMMANDS", "build_parser", "main"]
