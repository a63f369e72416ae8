"""``fedshift show ALGO``: an algorithm's paper, what it shares, its protocols and its
hyperparameters with their paper symbol, meaning and range (read from each field's ``hp()``
declaration by :func:`fedshift.core.hparams.describe_hparams`)."""

from __future__ import annotations

import argparse
import dataclasses
import inspect

from fedshift.cli.errors import Command
from fedshift.cli.tables import print_table
from fedshift.core.runconfig import RunConfig
from fedshift.scenarios import PROTOCOLS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("algorithm", help="an algorithm name (see `fedshift list algorithms`)")


def run(args: argparse.Namespace) -> int:
    from fedshift.algorithms import get_algorithm, origin_of
    from fedshift.core.hparams import describe_hparams

    cls = get_algorithm(args.algorithm)
    doc = inspect.getdoc(cls) or ""
    print(f"{args.algorithm}: {cls.paper or '(no paper given)'} [{origin_of(args.algorithm)}]")
    if doc:
        print("\n" + doc.split("\n\n")[0] + "\n")
    shares = ", ".join(f"{k} ({v.value})" for k, v in cls.shares.items()) or "nothing"
    if cls.pooled:
        shares = "nothing (pooled data, not federated)"
    print(f"shares:     {shares}")
    print(f"protocols:  {', '.join(cls.protocols or PROTOCOLS)}")
    print(f"problems:   {', '.join(cls.supported_problems())}")
    print(f"model:      {cls.default_model or RunConfig().model} (default)")
    infos = describe_hparams(cls.Hparams)
    if not infos:
        print("hyperparameters: none")
        return 0
    print("hyperparameters (--set algo.NAME=VALUE):")
    rows = [("name", "type", "default", "meaning", "sweep --random")]
    for info in infos:
        default = "(required)" if info.default is dataclasses.MISSING else repr(info.default)
        search = info.search_text or "-"
        rows.append((f"algo.{info.name}", info.type_text, default, info.summary(), search))
    print_table(rows, indent="  ")
    return 0


COMMAND = Command(
    "show", "an algorithm's hyperparameters, what it shares and its protocols", add_arguments, run
)
