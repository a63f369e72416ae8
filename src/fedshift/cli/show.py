"""``fedshift show ALGO``: an algorithm's paper, what it shares, its protocols and its
hyperparameters with their meaning."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re

from fedshift.cli.errors import Command
from fedshift.cli.tables import print_table
from fedshift.core.runconfig import PROTOCOLS, RunConfig


def hparam_docs(hparams: type) -> dict[str, str]:
    """Each hyperparameter's help: its field metadata (``symbol``, ``help``), else the
    comment lines just above the field in the source (where the paper's symbol is given)."""
    try:
        lines = inspect.getsource(hparams).splitlines()
    except (OSError, TypeError):
        lines = []
    docs = {}
    for item in dataclasses.fields(hparams):
        meta = " ".join(str(item.metadata[k]) for k in ("symbol", "help") if k in item.metadata)
        if not meta:
            at = next(
                (i for i, line in enumerate(lines) if re.match(rf"\s+{item.name}\s*:", line)), None
            )
            comments: list[str] = []
            while at is not None and at > 0 and lines[at - 1].strip().startswith("#"):
                at -= 1
                comments.insert(0, lines[at].strip().lstrip("#").strip())
            meta = " ".join(comments)
        docs[item.name] = meta
    return docs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("algorithm", help="an algorithm name (see `fedshift list algorithms`)")


def run(args: argparse.Namespace) -> int:
    from fedshift.algorithms import get_algorithm, origin_of
    from fedshift.core.hparams import hparam_types

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
    fields = dataclasses.fields(cls.Hparams)
    if not fields:
        print("hyperparameters: none")
        return 0
    print("hyperparameters (--set algo.NAME=VALUE):")
    types_ = hparam_types(cls.Hparams)
    docs = hparam_docs(cls.Hparams)
    rows = [("name", "type", "default", "meaning")]
    for item in fields:
        kind = types_[item.name]
        kind_text = getattr(kind, "__name__", None) or str(kind).replace("typing.", "")
        default = item.default if item.default is not dataclasses.MISSING else "(required)"
        rows.append((f"algo.{item.name}", kind_text, repr(default), docs[item.name]))
    print_table(rows, indent="  ")
    return 0


COMMAND = Command(
    "show", "an algorithm's hyperparameters, what it shares and its protocols", add_arguments, run
)
