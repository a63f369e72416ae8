"""The explicit algorithm registry: adding an algorithm adds one line here."""

from __future__ import annotations

from fedshift.algorithms.bd_fedproto import BDFedProto
from fedshift.algorithms.ccst import CCST
from fedshift.algorithms.centralized import Centralized
from fedshift.algorithms.ditto import Ditto
from fedshift.algorithms.fact import FACT
from fedshift.algorithms.fact_nf import FACTNoFinetune
from fedshift.algorithms.fada import FADA
from fedshift.algorithms.fedadg import FedADG
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.feddg_elcfs import FedDGELCFS
from fedshift.algorithms.fedga import FedGA
from fedshift.algorithms.fedproto import FedProto
from fedshift.algorithms.fedprox import FedProx
from fedshift.algorithms.fedsr import FedSR
from fedshift.algorithms.fpl import FPL
from fedshift.algorithms.local import Local
from fedshift.algorithms.moon import Moon
from fedshift.algorithms.perada import PerAda
from fedshift.core.algorithm import Algorithm

REGISTRY: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (
        # baselines
        FedAvg,
        FedProx,
        Local,
        Centralized,
        Ditto,
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


def get_algorithm(name: str) -> type[Algorithm]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown algorithm {name!r}; choose one of: {', '.join(REGISTRY)}"
        ) from None
