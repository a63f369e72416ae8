"""FedAvgM: FedAvg with server momentum (Hsu et al., 2019; Reddi et al., ICLR 2021)."""

from __future__ import annotations

from dataclasses import dataclass

from fedshift.algorithms._server_opt import ServerOptimizer
from fedshift.core.hparams import BaseHparams, hp, log_uniform, uniform


@dataclass(frozen=True)
class FedAvgMHparams(BaseHparams):
    server_lr: float = hp(
        1.0,
        "η",
        "server learning rate (Reddi et al.'s FedAvgM baseline and Hsu et al.: 1)",
        low=0,
        low_open=True,
        search=log_uniform(0.1, 3.0),
    )
    server_momentum: float = hp(
        0.9,
        "β",
        "server momentum (Hsu et al. 2019: 0.9; 0 is FedAvg)",
        low=0,
        high=1,
        high_open=True,
        search=uniform(0.0, 0.99),
    )


class FedAvgM(ServerOptimizer):
    """FedAvg whose server takes an SGD step with momentum on the pseudo-gradient
    ``g = x − mean(client models)``: ``v ← β·v + g``, ``x ← x − η·v`` (PyTorch's SGD
    convention, as Flower 1.41's ``FedAvgM``; ``v`` starts at 0, so round 1's ``v`` is
    ``g``). With η = 1 and β = 0 it is FedAvg.

    The momentum ``v`` lives in ``state.extra["momentum"]`` (checkpointed). Integer buffers
    (BatchNorm ``num_batches_tracked``) take FedAvg's rounded mean; Flower steps them as
    floats. Clients train exactly as in FedAvg (and may be vectorized).
    """

    name = "fedavgm"
    paper = (
        "Hsu, Qi and Brown, Measuring the Effects of Non-Identical Data Distribution for "
        "Federated Visual Classification, 2019 (server momentum as in Reddi et al., Adaptive "
        "Federated Optimization, ICLR 2021)"
    )
    Hparams = FedAvgMHparams
    buffers = ("momentum",)

    def server_step(self, model, deltas, moments, server_round):
        momentum = moments["momentum"]
        out = {}
        for key, delta in deltas.items():
            gradient = -delta
            momentum[key] = self.hp.server_momentum * momentum[key] + gradient
            out[key] = model[key] - self.hp.server_lr * momentum[key]
        return out
