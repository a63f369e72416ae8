"""FedYogi (Reddi et al., Adaptive Federated Optimization, ICLR 2021)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedshift.algorithms._adaptive_hparams import DecayingHparams
from fedshift.algorithms._server_opt import AdaptiveServerOptimizer
from fedshift.core.hparams import hp, log_uniform


@dataclass(frozen=True)
class FedYogiHparams(DecayingHparams):
    server_lr: float = hp(
        0.01,
        "η",
        "server learning rate (the paper tunes it per task; 0.01 is Flower's FedYogi default)",
        low=0,
        low_open=True,
        search=log_uniform(1e-3, 1.0),
    )


class FedYogi(AdaptiveServerOptimizer):
    """FedAvg's clients; the server keeps ``m ← β1·m + (1 − β1)·Δ`` and Yogi's
    ``v ← v − (1 − β2)·Δ²·sign(v − Δ²)`` of the pseudo-update ``Δ = mean(client models) − x``
    and steps ``x ← x + η·m / (√v + τ)``.

    ``m`` and ``v`` live in ``state.extra`` (``first_moment``, ``second_moment``),
    checkpointed. Integer buffers (BatchNorm ``num_batches_tracked``) take FedAvg's rounded
    mean. Deviation note: ``v`` starts at 0 as in Flower 1.41 (the paper allows any
    ``v_{-1} ≥ τ²``).
    """

    name = "fedyogi"
    paper = "Reddi et al., Adaptive Federated Optimization, ICLR 2021"
    Hparams = FedYogiHparams

    def second_moment(self, v: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        squared = delta**2
        return v - (1 - self.hp.beta2) * squared * torch.sign(v - squared)
