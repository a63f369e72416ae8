"""``fedshift list algorithms|datasets|models|partitions|presets`` (plug-ins marked);
``list datasets`` prints the listing of ``fedshift datasets list``. The module name ends in
``_`` so that it does not shadow the builtin ``list``."""

from __future__ import annotations

import argparse

from fedshift.cli.datasets import print_datasets
from fedshift.cli.errors import Command
from fedshift.cli.tables import print_table


def algorithm_rows() -> list[tuple[str, ...]]:
    from fedshift.algorithms import algorithm_names
    from fedshift.algorithms.description import describe_algorithm

    rows = [("name", "shares", "paper", "from")]
    for name in algorithm_names():
        about = describe_algorithm(name)
        rows.append((name, about.shares_text(":"), about.paper, about.origin))
    return rows


def preset_rows() -> list[tuple[str, ...]]:
    from fedshift.presets import load_preset, preset_names

    rows = [("name", "algorithm", "dataset", "paper", "paper's number")]
    for name in preset_names():
        preset = load_preset(name)
        paper = preset.meta.get("paper", "-")
        result = preset.paper_number or preset.meta.get("paper_result", "-")
        rows.append((name, preset.algorithm, preset.dataset, paper, result))
    return rows


def model_rows() -> list[tuple[str, ...]]:
    from fedshift.models.registry import all_models

    rows = [("name", "description", "weights (model_weights=imagenet)", "from")]
    rows += [
        (name, card.description, card.weight_line, card.origin)
        for name, card in all_models().items()
    ]
    return rows


def partition_rows() -> list[tuple[str, ...]]:
    from fedshift.data.partitioners import PARTITIONERS

    rows = [("name", "run keys", "description")]
    rows += [(name, ", ".join(p.keys) or "-", p.help) for name, p in PARTITIONERS.items()]
    return rows


TABLES = {
    "algorithms": algorithm_rows,
    "models": model_rows,
    "partitions": partition_rows,
    "presets": preset_rows,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    choices = sorted([*TABLES, "datasets"])
    parser.add_argument("what", choices=choices, metavar="{" + ",".join(choices) + "}")


def run(args: argparse.Namespace) -> int:
    if args.what == "datasets":
        print_datasets()
    else:
        print_table(TABLES[args.what]())
    return 0


COMMAND = Command(
    "list",
    "list algorithms, datasets, models (plug-ins marked), partition schemes or paper presets",
    add_arguments,
    run,
)
