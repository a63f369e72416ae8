"""``fedshift show ALGO``: an algorithm's paper, what it shares, its protocols and its
hyperparameters with their paper symbol, meaning and range (read by
:func:`fedshift.algorithms.description.describe_algorithm`, as ``list`` and the method pages)."""

from __future__ import annotations

import argparse
import dataclasses

from fedshift.cli.errors import Command
from fedshift.cli.tables import print_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("algorithm", help="an algorithm name (see `fedshift list algorithms`)")


def run(args: argparse.Namespace) -> int:
    from fedshift.algorithms.description import describe_algorithm

    about = describe_algorithm(args.algorithm)
    print(f"{about.name}: {about.paper or '(no paper given)'} [{about.origin}]")
    if about.summary:
        print("\n" + about.summary + "\n")
    print(f"shares:     {about.shares_text()}")
    print(f"protocols:  {', '.join(about.protocols)}")
    print(f"problems:   {', '.join(about.problems)}")
    print(f"model:      {about.default_model} (default)")
    if not about.hparams:
        print("hyperparameters: none")
        return 0
    print("hyperparameters (--set algo.NAME=VALUE):")
    rows = [("name", "type", "default", "meaning", "sweep --random")]
    for info in about.hparams:
        default = "(required)" if info.default is dataclasses.MISSING else repr(info.default)
        search = info.search_text or "-"
        rows.append((f"algo.{info.name}", info.type_text, default, info.summary(), search))
    print_table(rows, indent="  ")
    return 0


COMMAND = Command(
    "show", "an algorithm's hyperparameters, what it shares and its protocols", add_arguments, run
)
