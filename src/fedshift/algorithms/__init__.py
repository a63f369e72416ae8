"""The algorithm registry: the built-ins listed explicitly (adding one adds one line to
:data:`BUILTINS`), :func:`register_algorithm` for a script's own, and plug-ins looked up on
first use (an entry point of group ``fedshift.algorithms`` or an import path
``package.module:Class``).

A built-in's module (and torch with it) is imported the first time its class is asked for,
as ``models/cards.py``'s ``Builder`` does for the backbones: ``fedshift list algorithms`` and
``fedshift show ALGO`` read a built-in's description from
:mod:`fedshift.algorithms.builtin_descriptions` instead (generated from the classes, and
checked against them by ``tests/algorithms/test_builtin_descriptions.py``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from fedshift.core.errors import ConfigError, did_you_mean
from fedshift.core.hparams import BaseHparams
from fedshift.core.lazytable import LazyTable
from fedshift.plugins import (
    is_import_path,
    load_import_path,
    load_plugin,
    plugin_names,
    plugin_source,
)

if TYPE_CHECKING:  # imports torch: the listing and describing code must not
    from fedshift.core.algorithm import Algorithm

log = logging.getLogger(__name__)

#: the built-in algorithms, name -> ``module:Class`` in ``fedshift.algorithms`` (their names
#: never change meaning; each module is imported on first use)
BUILTINS: dict[str, str] = {
    # baselines
    "fedavg": "fedavg:FedAvg",
    "fedprox": "fedprox:FedProx",
    "local": "local:Local",
    "centralized": "centralized:Centralized",
    "ditto": "ditto:Ditto",
    # server optimizers (Reddi et al., 2021)
    "fedavgm": "fedavgm:FedAvgM",
    "fedadagrad": "fedadagrad:FedAdagrad",
    "fedadam": "fedadam:FedAdam",
    "fedyogi": "fedyogi:FedYogi",
    # drift correction and normalized averaging
    "scaffold": "scaffold:Scaffold",
    "feddyn": "feddyn:FedDyn",
    "fednova": "fednova:FedNova",
    # representation and prototype family
    "moon": "moon:Moon",
    "fedproto": "fedproto:FedProto",
    "bd-fedproto": "bd_fedproto:BDFedProto",
    "fpl": "fpl:FPL",
    "fedsr": "fedsr:FedSR",
    # data manipulation and learning strategies
    "ccst": "ccst:CCST",
    "feddg-elcfs": "feddg_elcfs:FedDGELCFS",
    "fedga": "fedga:FedGA",
    "perada": "perada:PerAda",
    "fedadg": "fedadg:FedADG",
    # unsupervised federated domain adaptation (unlabeled target client)
    "fada": "fada:FADA",
    "fact": "fact:FACT",
    "fact-nf": "fact_nf:FACTNoFinetune",
}


class AlgorithmRegistry(LazyTable):
    """Name -> algorithm class: the built-ins (each module imported on first use), the
    registered ones, and plug-ins, looked up the first time they are asked for (and kept)."""

    def load_builtin(self, name: str) -> type[Algorithm]:
        cls = super().load_builtin(name)
        if cls.name != name:
            raise RuntimeError(
                f"BUILTINS names {BUILTINS[name]} {name!r}; its name is {cls.name!r}"
            )
        return cls

    def find(self, name: str) -> type[Algorithm]:
        cls = find_plugin(name)
        if cls is None:
            raise KeyError(name)
        return cls

    def __contains__(self, name: object) -> bool:
        if self.known(name):
            return True
        return isinstance(name, str) and find_plugin(name) is not None


REGISTRY = AlgorithmRegistry(__name__, BUILTINS)


def check_algorithm_class(cls: object, origin: str) -> type[Algorithm]:
    """``cls`` if it is a usable algorithm class; a ConfigError saying what is wrong otherwise."""
    from fedshift.core.algorithm import Algorithm

    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ConfigError(
            f"{origin} is {cls!r}, not a subclass of fedshift.core.algorithm.Algorithm"
        )
    hparams = getattr(cls, "Hparams", None)
    if not (isinstance(hparams, type) and issubclass(hparams, BaseHparams)):
        raise ConfigError(
            f"{origin}: {cls.__name__}.Hparams must be a dataclass deriving from "
            "fedshift.core.hparams.BaseHparams (NoHparams when it has none)"
        )
    return cls


def find_plugin(name: str) -> type[Algorithm] | None:
    """The plug-in algorithm ``name`` (entry point or ``module:Class``); None if none."""
    if is_import_path(name):
        return check_algorithm_class(load_import_path(name, "algorithm"), f"algorithm {name!r}")
    cls = load_plugin("algorithm", name)
    if cls is None:
        return None
    return check_algorithm_class(cls, f"algorithm plug-in {name!r}")


def get_algorithm(name: str) -> type[Algorithm]:
    """The algorithm class ``name`` (built-in, registered or plug-in); ConfigError otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        known = [*REGISTRY]
        known += [n for n in plugin_names("algorithm") if not REGISTRY.known(n)]
        raise ConfigError(
            f"unknown algorithm {name!r}{did_you_mean(name, known)}; choose one of: "
            f"{', '.join(known)} (or a plug-in as package.module:Class)"
        ) from None


def origin_of(name: str) -> str:
    """Where algorithm ``name`` comes from: built-in, plug-in (its package) or registered."""
    if name in BUILTINS:
        return "built-in"
    if name in plugin_names("algorithm"):
        return f"plug-in {plugin_source('algorithm', name)}"
    return "import path" if is_import_path(name) else "registered"


def algorithm_names() -> list[str]:
    """Built-in, registered and installed plug-in algorithm names, importing no built-in (a
    broken plug-in is a one-line warning and left out)."""
    for name in plugin_names("algorithm"):
        if not REGISTRY.known(name):
            try:
                REGISTRY[name]
            except ConfigError as exc:
                log.warning("%s", exc)
    return list(REGISTRY)


def all_algorithms() -> dict[str, type[Algorithm]]:
    """Built-in, registered and installed plug-in algorithms, name -> class (imports every
    built-in; a broken plug-in is a one-line warning and left out)."""
    return {name: REGISTRY[name] for name in algorithm_names()}


def register_algorithm(
    cls: type[Algorithm], name: str | None = None, *, replace: bool = False
) -> type[Algorithm]:
    """Make ``cls`` runnable as ``algorithm=name`` (default: ``cls.name``); returns ``cls``,
    so it also works as a class decorator. A built-in name is never replaced; another
    registered name only with ``replace=True``."""
    name = name or cls.name
    if not name:
        raise ConfigError(f"{cls!r} needs a name: set its class attribute `name` or pass name=")
    check_algorithm_class(cls, f"algorithm {name!r}")
    if name in BUILTINS and REGISTRY[name] is not cls:
        raise ConfigError(f"algorithm {name!r} is built in; register yours under another name")
    if REGISTRY.known(name) and REGISTRY[name] is not cls and not replace:
        raise ConfigError(f"algorithm {name!r} is registered already; pass replace=True")
    REGISTRY[name] = cls
    return cls
