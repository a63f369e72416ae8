"""The explicit algorithm registry: adding an algorithm adds one line here."""

from __future__ import annotations

from fedshift.algorithms.centralized import Centralized
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.fedprox import FedProx
from fedshift.algorithms.local import Local
from fedshift.core.algorithm import Algorithm

REGISTRY: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (
        FedAvg,
        FedProx,
        Local,
        Centralized,
    )
}


def get_algorithm(name: str) -> type[Algorithm]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown algorithm {name!r}; choose one of: {', '.join(REGISTRY)}"
        ) from None
