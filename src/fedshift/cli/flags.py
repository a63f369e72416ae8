"""The one table of run flags: each declares its argparse option and the run key it sets.

``fedshift run`` takes them all, ``fedshift sweep`` those marked ``in_sweep``; both read the
values back with :func:`flag_values`, so a flag is named once, here.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fedshift.cli.datasets import dataset_help
from fedshift.core.runconfig import DEVICES, PARTITIONS, RunConfig
from fedshift.scenarios import PROTOCOLS


@dataclass(frozen=True)
class RunFlag:
    """A command-line option that sets the run key ``key`` (also its argparse dest)."""

    key: str
    names: tuple[str, ...]
    help: str
    type: type = str
    in_sweep: bool = False


def run_flags() -> tuple[RunFlag, ...]:
    """Every run flag, its help showing the default of :class:`RunConfig`."""
    defaults = RunConfig()
    return (
        RunFlag(
            "algorithm",
            ("-a", "--algorithm"),
            f"algorithm (default {defaults.algorithm}; see `fedshift list algorithms`), "
            "or a plug-in as package.module:Class",
        ),
        RunFlag("dataset", ("-d", "--dataset"), dataset_help(defaults.dataset), in_sweep=True),
        RunFlag(
            "target", ("-t", "--target"), f"held-out target domain (default {defaults.target})"
        ),
        RunFlag(
            "sources", ("-s", "--sources"), "comma-separated source domains (default: all others)"
        ),
        RunFlag(
            "protocol",
            ("--protocol",),
            f"evaluation protocol: {', '.join(PROTOCOLS)} (default {defaults.protocol})",
            in_sweep=True,
        ),
        RunFlag("rounds", ("--rounds",), f"rounds (default {defaults.rounds})", int, True),
        RunFlag(
            "local_epochs",
            ("--local-epochs",),
            f"local epochs per round (default {defaults.local_epochs})",
            int,
        ),
        RunFlag(
            "clients_per_domain",
            ("--clients-per-domain",),
            f"clients each domain is split into (default {defaults.clients_per_domain})",
            int,
        ),
        RunFlag(
            "partition",
            ("--partition",),
            f"how the source data is split among clients: {', '.join(PARTITIONS)} "
            "(iid, dirichlet, nway-kshot: each domain on its own; heterogeneity: across the "
            f"source domains, --set lambda=L) (default {defaults.partition})",
        ),
        RunFlag(
            "model",
            ("--model",),
            f"backbone (default: the algorithm's, else {defaults.model}; see `fedshift list "
            "models`), or a plug-in as package.module:builder",
            in_sweep=True,
        ),
        RunFlag("seed", ("--seed",), f"seed (default {defaults.seed})", int),
        RunFlag("device", ("--device",), f"{', '.join(DEVICES)} (default {defaults.device})"),
        RunFlag(
            "preset",
            ("--preset",),
            "start from a paper preset (see `fedshift list presets`) or a preset TOML file; "
            "--config, flags and --set override its settings",
        ),
    )


def command_flags(*, sweep: bool = False, keys: tuple[str, ...] = ()) -> tuple[RunFlag, ...]:
    """The run flags of ``fedshift run``; with ``sweep`` those a sweep shares; with ``keys``
    those setting one of these run keys (``fedshift pretrain``)."""
    return tuple(
        flag
        for flag in run_flags()
        if (flag.in_sweep or not sweep) and (not keys or flag.key in keys)
    )


def add_run_flags(
    parser: argparse.ArgumentParser, *, sweep: bool = False, keys: tuple[str, ...] = ()
) -> None:
    """Declare the run flags on ``parser`` (all, a sweep's, or those of ``keys``)."""
    for flag in command_flags(sweep=sweep, keys=keys):
        parser.add_argument(*flag.names, dest=flag.key, type=flag.type, help=flag.help)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` and ``--set KEY=VALUE``: any run key, as ``fedshift run`` takes them."""
    parser.add_argument("--config", help="TOML file with run keys and an [algo] table")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key, e.g. --set lr=0.05 --set algo.mu=0.1",
    )


def flag_values(
    args: argparse.Namespace, *, sweep: bool = False, keys: tuple[str, ...] = ()
) -> dict[str, object]:
    """Run key -> the value given on the command line (None where the flag was left out)."""
    return {flag.key: getattr(args, flag.key) for flag in command_flags(sweep=sweep, keys=keys)}
