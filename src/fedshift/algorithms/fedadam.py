"""FedAdam (Reddi et al., Adaptive Federated Optimization, ICLR 2021)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedshift.algorithms._adaptive_hparams import DecayingHparams
from fedshift.algorithms._server_opt import AdaptiveServerOptimizer
from fedshift.core.hparams import hp


@dataclass(frozen=True)
class FedAdamHparams(DecayingHparams):
    bias_correction: bool = hp(
        False,
        "",
        "scale η by √(1 − β2^(t+1)) / (1 − β1^(t+1)) at server round t, as Flower 1.41's "
        "FedAdam does; the paper's Algorithm 2 has no bias correction",
    )


class FedAdam(AdaptiveServerOptimizer):
    """FedAvg's clients; the server keeps ``m ← β1·m + (1 − β1)·Δ`` and
    ``v ← β2·v + (1 − β2)·Δ²`` of the pseudo-update ``Δ = mean(client models) − x`` and
    steps ``x ← x + η·m / (√v + τ)``.

    ``m`` and ``v`` live in ``state.extra`` (``first_moment``, ``second_moment``),
    checkpointed. Integer buffers (BatchNorm ``num_batches_tracked``) take FedAvg's rounded
    mean. Deviation notes: ``v`` starts at 0 as in Flower 1.41 (the paper allows any
    ``v_{-1} ≥ τ²``); Flower always applies Adam's bias correction with exponent t + 1,
    the paper none: ``algo.bias_correction=true`` gives Flower's rule.
    """

    name = "fedadam"
    paper = "Reddi et al., Adaptive Federated Optimization, ICLR 2021"
    Hparams = FedAdamHparams

    def second_moment(self, v: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return self.hp.beta2 * v + (1 - self.hp.beta2) * delta**2

    def step_size(self, server_round: int) -> float:
        if not self.hp.bias_correction:
            return self.hp.server_lr
        t = server_round + 1.0
        return self.hp.server_lr * math.sqrt(1 - self.hp.beta2**t) / (1 - self.hp.beta1**t)
