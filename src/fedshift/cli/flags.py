"""The one table of run flags: each declares its argparse option and the run key it sets.

``fedshift run`` takes them all, ``fedshift sweep`` those marked ``in_sweep``; both read the
values back with :func:`flag_values`, so a flag is named once, here.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from fedshift.cli.datasets import dataset_help
from fedshift.core.runconfig import describe_run_keys


@dataclass(frozen=True)
class RunFlag:
    """A command-line option that sets the run key ``key`` (also its argparse dest); its help
    is the key's declared meaning and default (:func:`~fedshift.core.runconfig.
    describe_run_keys`), followed by ``extra``."""

    key: str
    names: tuple[str, ...]
    type: type = str
    in_sweep: bool = False
    extra: str = ""

    def help(self) -> str:
        info = RUN_KEY_INFO[self.key]
        text = f"{info.meaning} (default {info.default})" if info.default != "" else info.meaning
        return f"{text}; {self.extra}" if self.extra else text


#: each run key's declaration, as the flags' help reads it
RUN_KEY_INFO = {info.name: info for info in describe_run_keys()}


def partition_help() -> str:
    """Each partition scheme with its help and the run keys it reads."""
    from fedshift.data.partitioners import PARTITIONERS

    return "; ".join(
        f"{name}: {p.help}" + (f" ({', '.join(p.keys)})" if p.keys else "")
        for name, p in PARTITIONERS.items()
    )


def run_flags() -> tuple[RunFlag, ...]:
    """Every run flag (its help read from the run key's declaration)."""
    return (
        RunFlag("algorithm", ("-a", "--algorithm")),
        RunFlag("dataset", ("-d", "--dataset"), in_sweep=True, extra=dataset_help()),
        RunFlag("target", ("-t", "--target")),
        RunFlag("sources", ("-s", "--sources")),
        RunFlag("protocol", ("--protocol",), in_sweep=True),
        RunFlag("rounds", ("--rounds",), int, True),
        RunFlag("local_epochs", ("--local-epochs",), int),
        RunFlag("clients_per_domain", ("--clients-per-domain",)),
        RunFlag("partition", ("--partition",), extra=partition_help()),
        RunFlag("model", ("--model",), in_sweep=True),
        RunFlag("seed", ("--seed",), int),
        RunFlag("device", ("--device",)),
        RunFlag("preset", ("--preset",), extra="--config, flags and --set override its settings"),
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
        parser.add_argument(*flag.names, dest=flag.key, type=flag.type, help=flag.help())


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
