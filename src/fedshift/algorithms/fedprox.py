"""FedProx (Li et al., 2020)."""

from __future__ import annotations

from dataclasses import dataclass

from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.toolkit import proximal_penalty, reply_with_model
from fedshift.core.algorithm import SupervisedPlan
from fedshift.core.context import ClientContext
from fedshift.core.hparams import BaseHparams, hp, log_uniform
from fedshift.core.record import Record


@dataclass(frozen=True)
class FedProxHparams(BaseHparams):
    mu: float = hp(
        0.01,
        "μ",
        "weight of the proximal term μ/2·‖w − θ‖²; the paper tunes it in {0.001, 0.01, 0.1, 0.5, "
        "1}, FPL and CCST use 0.01",
        low=0,
        search=log_uniform(1e-3, 1.0),
    )


class FedProx(FedAvg):
    """FedAvg whose local loss adds μ/2·‖w − θ‖² towards the received global model θ.

    The proximal term covers trainable parameters only (not BatchNorm buffers), as in the
    official code. Deviation note: the paper's inexact-solver / partial-work (straggler)
    setting is not simulated; every client runs the full E epochs.
    """

    name = "fedprox"
    paper = "Li et al., Federated Optimization in Heterogeneous Networks, MLSys 2020"
    Hparams = FedProxHparams

    def local_penalty(self, ctx: ClientContext, record: Record):
        anchor = {k: v.to(ctx.device) for k, v in record.subset("model").items()}
        return proximal_penalty(anchor, self.hp.mu)

    def batch_plan(self, task: str, ctx: ClientContext, record: Record) -> SupervisedPlan | None:
        """FedAvg's supervised ``train`` task with the proximal term towards the sent model."""
        cls = type(self)
        if (
            task != "train"
            or self.run.problem != "classification"
            or cls.train is not FedAvg.train
            or cls.local_penalty is not FedProx.local_penalty
        ):
            return None
        return SupervisedPlan(start=record.subset("model"), finish=reply_with_model, mu=self.hp.mu)
