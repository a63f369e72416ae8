"""``fedshift show ALGO``: an algorithm's paper, what it shares, its protocols and its
hyperparameters with their paper symbol, meaning and range (read by
:func:`fedshift.algorithms.description.describe_algorithm`, as ``list`` and the method pages).
``fedshift show run``: every run key by section with its type, default, range, search
distribution, resume rule and meaning (read by :func:`fedshift.core.runconfig.
describe_run_keys`, as the run-keys page and the run flags' help)."""

from __future__ import annotations

import argparse
import dataclasses

from fedshift.cli.errors import Command
from fedshift.cli.tables import print_table

#: ``fedshift show run``: the run keys rather than an algorithm
RUN = "run"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "algorithm",
        help="an algorithm name (see `fedshift list algorithms`), or `run` for every run key",
    )


def run_key_rows(group: str) -> list[tuple[str, ...]]:
    """One row per run key of section ``group``: key, type, default, range, search, resume
    rule, symbol and meaning."""
    from fedshift.core.runconfig import describe_run_keys

    rows = [("key", "type", "default", "range", "sweep --random", "resume", "meaning")]
    for info in describe_run_keys():
        if info.group == group:
            meaning = " ".join(part for part in (info.symbol, info.meaning) if part)
            rows.append(
                (
                    info.name,
                    info.type_text,
                    repr(info.default),
                    info.range_text or "-",
                    info.search_text or "-",
                    info.resume,
                    meaning,
                )
            )
    return rows


def print_run_keys() -> None:
    """Every run key, section by section (``--set KEY=VALUE``, a TOML file's top level)."""
    from fedshift.core.runconfig import SECTIONS

    print("run keys (--set KEY=VALUE, or top-level keys of a --config TOML file):")
    for group, about in SECTIONS.items():
        print(f"\n{group}: {about}")
        print_table(run_key_rows(group), indent="  ")


def run(args: argparse.Namespace) -> int:
    if args.algorithm == RUN:
        print_run_keys()
        return 0
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
    "show",
    "an algorithm's hyperparameters, what it shares and its protocols; `show run`: every run key",
    add_arguments,
    run,
)
