"""FedAdagrad (Reddi et al., Adaptive Federated Optimization, ICLR 2021)."""

from __future__ import annotations

import torch

from fedshift.algorithms._adaptive_hparams import AdaptiveHparams
from fedshift.algorithms._server_opt import AdaptiveServerOptimizer


class FedAdagrad(AdaptiveServerOptimizer):
    """FedAvg's clients; the server keeps ``m ← β1·m + (1 − β1)·Δ`` and ``v ← v + Δ²`` of the
    pseudo-update ``Δ = mean(client models) − x`` and steps ``x ← x + η·m / (√v + τ)``.

    ``m`` and ``v`` live in ``state.extra`` (``first_moment``, ``second_moment``),
    checkpointed. Integer buffers (BatchNorm ``num_batches_tracked``) take FedAvg's rounded
    mean. Deviation notes: ``v`` starts at 0 as in Flower 1.41 (the paper's Algorithm 2
    allows any ``v_{-1} ≥ τ²``); β1 = 0.9 is the paper's, Flower's ``FedAdagrad`` fixes
    β1 = 0 (``algo.beta1=0`` gives Flower's rule).
    """

    name = "fedadagrad"
    paper = "Reddi et al., Adaptive Federated Optimization, ICLR 2021"
    Hparams = AdaptiveHparams

    def second_moment(self, v: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        return v + delta**2
