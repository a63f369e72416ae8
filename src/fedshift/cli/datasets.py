"""``fedshift datasets list|check|show``: the dataset listing (also ``fedshift list
datasets``) and the ``--dataset`` help, both generated from the catalog, the built-in
``digits-dg`` and the registered and plug-in datasets."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from fedshift.cli.errors import ArgumentParser, Command, add_force_flag


@dataclass(frozen=True)
class DatasetLine:
    """One dataset as the listing shows it; a field left empty is not printed."""

    name: str
    source: str
    runs: str
    resolution: int | None = None
    domains: str = ""
    classes: str = ""
    layout: str = ""
    split: str = ""


def catalog_run_line(entry) -> str:
    """The command that runs a catalog dataset as printed: a multi-domain set with its first
    domain as the target (the default target, mnistm, is digits-dg's), segmentation sets
    with their model; a one-domain set (CIFAR) split by label skew into personalized
    clients; FEMNIST's writers (found in the copy, not on the card) per domain, each writer a
    client trained and tested on its own samples, as in LEAF."""
    import shlex

    from fedshift.data.catalog.elcfs import SETS as SEGMENTATION_SETS

    if not entry.domains:
        flags = " --protocol per-domain"
    elif len(entry.domains) == 1:
        flags = " --protocol personalized --partition dirichlet --clients-per-domain 10"
    else:
        flags = f" -t {shlex.quote(entry.domains[0])}"
    task = " --set problem=segmentation --model unet" if entry.name in SEGMENTATION_SETS else ""
    return f"fedshift run -d {entry.name}{flags}{task} --set data_root=PATH"


def dataset_lines() -> list[DatasetLine]:
    """Every dataset ``-d`` accepts: the catalog (read from your copy), the built-in one,
    the registered and plug-in ones, then any folder PATH."""
    from fedshift.data import digits
    from fedshift.data.catalog import CATALOG
    from fedshift.data.custom import custom_datasets, registered_datasets
    from fedshift.data.registry import FOLDER_IMAGE_SIZE

    lines = [
        DatasetLine(
            entry.name,
            entry.source,
            runs=catalog_run_line(entry),
            resolution=entry.resolution,
            domains=entry.domain_line(),
            classes=entry.class_line(),
            layout=entry.layout,
            split=entry.split,
        )
        for entry in CATALOG.values()
    ]
    lines.append(
        DatasetLine(
            digits.NAME,
            f"built in: {digits.DESCRIPTION}",
            runs=f"fedshift run -d {digits.NAME}",
            resolution=digits.IMAGE_SIZE,
            domains=", ".join(digits.DOMAINS),
            classes=", ".join(digits.CLASSES),
            split="fixed train/val/test per domain",
        )
    )
    descriptions = registered_datasets()
    for name, origin in custom_datasets().items():
        source = f"{origin}: {descriptions[name]}" if name in descriptions else origin
        lines.append(DatasetLine(name, source, runs=f"fedshift run -d {name}"))
    lines.append(
        DatasetLine(
            "PATH",
            "any folder laid out ROOT/<domain>/<class>/<image> (generic fallback)",
            runs="fedshift run -d PATH (or folder:PATH); --set image_size=N to resize",
            resolution=FOLDER_IMAGE_SIZE,
            domains="the domain folders",
            classes="the class folders found, sorted",
            split="seeded stratified 70/10/20 per domain (--set split_seed=N)",
        )
    )
    return lines


def print_datasets() -> None:
    """The dataset listing, one block per dataset."""
    for line in dataset_lines():
        size = f"  [{line.resolution} px]" if line.resolution is not None else ""
        print(f"{line.name}{size}  {line.source}")
        if line.domains:
            print(f"    domains: {line.domains}")
        if line.classes:
            print(f"    classes: {line.classes}")
        if line.layout:
            print(f"    layout:  {line.layout}")
        if line.split:
            print(f"    split:   {line.split}")
        print(f"    runs:    {line.runs}")


def dataset_help() -> str:
    """The ``--dataset`` help beside the run key's meaning: every name and the resolution
    each is read at."""
    from fedshift.data import digits
    from fedshift.data.catalog import CATALOG
    from fedshift.data.custom import custom_datasets
    from fedshift.data.registry import FOLDER_IMAGE_SIZE

    by_size: dict[int, list[str]] = {}
    for entry in CATALOG.values():
        by_size.setdefault(entry.resolution, []).append(entry.name)
    sizes = "; ".join(f"{size} px: {', '.join(names)}" for size, names in by_size.items())
    custom = ", ".join(custom_datasets())
    return (
        "see `fedshift datasets list`. A catalog dataset reads your copy (--set data_root=PATH) "
        "with its official split "
        f"(--set split_files=DIR for your own lists) at its resolution ({sizes}); "
        f"{digits.NAME} is built in ({digits.IMAGE_SIZE} px); a folder path is resized to "
        f"{FOLDER_IMAGE_SIZE} px; --set image_size=N overrides"
        + (f"; registered and plug-in datasets: {custom}" if custom else "")
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from fedshift.data import digits

    actions = parser.add_subparsers(dest="action", parser_class=ArgumentParser, required=True)
    actions.add_parser(
        "list",
        help="every dataset: source, domains, classes, layout, split, resolution, how to run it",
    )
    check = actions.add_parser("check", help="validate a copy; per-domain, per-split counts")
    check.add_argument(
        "name",
        help="a catalog name (see `fedshift datasets list`); NAME:dom1,dom2 checks only "
        "those domains' files",
    )
    check.add_argument("--root", required=True, help="where the dataset lies")
    show = actions.add_parser("show", help="write a grid of samples per domain")
    show.add_argument("name", nargs="?", default=digits.NAME)
    show.add_argument(
        "--out", default="digits-grid.png", help="figure file (.png, .pdf, .svg, .jpg)"
    )
    show.add_argument("--per-domain", type=int, default=10, dest="per_domain")
    add_force_flag(show)


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        print_datasets()
    elif args.action == "check":
        from fedshift.data.catalog import check_dataset, split_name

        name, domains = split_name(args.name)
        counts, warnings = check_dataset(name, args.root, domains)
        for domain, splits in counts.items():
            print(f"{domain}: " + ", ".join(f"{s} {n}" for s, n in splits.items()))
        for warning in warnings:
            print(f"fedshift: warning: {warning}", file=sys.stderr)
    else:
        from fedshift.core.outputs import FIGURE, check_output
        from fedshift.data import load_dataset
        from fedshift.data.preview import save_sample_grid

        check_output(args.out, FIGURE, "--out", force=args.force)
        dataset = load_dataset(args.name)
        path = save_sample_grid(
            dataset, Path(args.out), per_domain=args.per_domain, force=args.force
        )
        print(f"wrote {path}")
    return 0


COMMAND = Command("datasets", "inspect datasets", add_arguments, run)
