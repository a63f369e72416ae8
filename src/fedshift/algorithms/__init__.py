"""The algorithm registry: the built-ins listed explicitly (adding one adds one line here),
:func:`register_algorithm` for a script's own, and plug-ins looked up on first use (an
entry point of group ``fedshift.algorithms`` or an import path ``package.module:Class``)."""

from __future__ import annotations

import logging

from fedshift.algorithms.bd_fedproto import BDFedProto
from fedshift.algorithms.ccst import CCST
from fedshift.algorithms.centralized import Centralized
from fedshift.algorithms.ditto import Ditto
from fedshift.algorithms.fact import FACT
from fedshift.algorithms.fact_nf import FACTNoFinetune
from fedshift.algorithms.fada import FADA
from fedshift.algorithms.fedadagrad import FedAdagrad
from fedshift.algorithms.fedadam import FedAdam
from fedshift.algorithms.fedadg import FedADG
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.fedavgm import FedAvgM
from fedshift.algorithms.feddg_elcfs import FedDGELCFS
from fedshift.algorithms.feddyn import FedDyn
from fedshift.algorithms.fedga import FedGA
from fedshift.algorithms.fednova import FedNova
from fedshift.algorithms.fedproto import FedProto
from fedshift.algorithms.fedprox import FedProx
from fedshift.algorithms.fedsr import FedSR
from fedshift.algorithms.fedyogi import FedYogi
from fedshift.algorithms.fpl import FPL
from fedshift.algorithms.local import Local
from fedshift.algorithms.moon import Moon
from fedshift.algorithms.perada import PerAda
from fedshift.algorithms.scaffold import Scaffold
from fedshift.core.algorithm import Algorithm
from fedshift.core.errors import ConfigError, did_you_mean
from fedshift.core.hparams import BaseHparams
from fedshift.plugins import (
    is_import_path,
    load_import_path,
    load_plugin,
    plugin_names,
    plugin_source,
)

log = logging.getLogger(__name__)


class AlgorithmRegistry(dict):
    """Name -> algorithm class; a missing name is looked up among the plug-ins (and kept)."""

    def __missing__(self, name: str) -> type[Algorithm]:
        cls = find_plugin(name)
        if cls is None:
            raise KeyError(name)
        self[name] = cls
        return cls

    def __contains__(self, name: object) -> bool:
        if dict.__contains__(self, name):
            return True
        return isinstance(name, str) and find_plugin(name) is not None


#: the built-in algorithms (their names never change meaning)
BUILTINS: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (
        # baselines
        FedAvg,
        FedProx,
        Local,
        Centralized,
        Ditto,
        # server optimizers (Reddi et al., 2021)
        FedAvgM,
        FedAdagrad,
        FedAdam,
        FedYogi,
        # drift correction and normalized averaging
        Scaffold,
        FedDyn,
        FedNova,
        # representation and prototype family
        Moon,
        FedProto,
        BDFedProto,
        FPL,
        FedSR,
        # data manipulation and learning strategies
        CCST,
        FedDGELCFS,
        FedGA,
        PerAda,
        FedADG,
        # unsupervised federated domain adaptation (unlabeled target client)
        FADA,
        FACT,
        FACTNoFinetune,
    )
}
REGISTRY: dict[str, type[Algorithm]] = AlgorithmRegistry(BUILTINS)


def check_algorithm_class(cls: object, origin: str) -> type[Algorithm]:
    """``cls`` if it is a usable algorithm class; a ConfigError saying what is wrong otherwise."""
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
        known += [n for n in plugin_names("algorithm") if not dict.__contains__(REGISTRY, n)]
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


def all_algorithms() -> dict[str, type[Algorithm]]:
    """Built-in, registered and installed plug-in algorithms (a broken plug-in is a one-line
    warning and left out)."""
    for name in plugin_names("algorithm"):
        if not dict.__contains__(REGISTRY, name):
            try:
                REGISTRY[name]
            except ConfigError as exc:
                log.warning("%s", exc)
    return dict(REGISTRY)


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
    if name in BUILTINS and BUILTINS[name] is not cls:
        raise ConfigError(f"algorithm {name!r} is built in; register yours under another name")
    if dict.__contains__(REGISTRY, name) and REGISTRY[name] is not cls and not replace:
        raise ConfigError(f"algorithm {name!r} is registered already; pass replace=True")
    REGISTRY[name] = cls
    return cls
