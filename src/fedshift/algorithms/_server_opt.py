"""The server step of Reddi et al. (ICLR 2021), shared by FedAvgM, FedAdagrad, FedAdam and
FedYogi: the clients run FedAvg's local training, the server turns FedAvg's mean into a
pseudo-gradient and takes one optimizer step on the global model.

Where server state lives: the moment buffers are tensors in ``state.extra`` (one dict per
buffer, keyed like the model), so the checkpoint holds them beside the model and ``--resume``
continues the same optimizer. Integer buffers (BatchNorm ``num_batches_tracked``) are not
stepped: they take FedAvg's rounded weighted mean (a step count has no gradient).
"""

from __future__ import annotations

import torch

from fedshift.algorithms.fedavg import FedAvg
from fedshift.core.federation import Federation
from fedshift.core.state import ServerState

Tensors = dict[str, torch.Tensor]


def floating(model: Tensors) -> list[str]:
    """The keys the server optimizer steps: floating tensors (weights, BN running stats)."""
    return [key for key, value in model.items() if value.is_floating_point()]


class ServerOptimizer(FedAvg):
    """FedAvg's clients with a server optimizer: ``Δ = mean(client models) − x`` is the
    pseudo-gradient's negative, and :meth:`server_step` turns it into the new model.

    Subclasses name the buffers they keep (``buffers``) and implement :meth:`server_step`.
    A round with no reply leaves model and buffers as they were.
    """

    #: names of the per-key buffers kept in ``state.extra`` (zero at the start)
    buffers: tuple[str, ...] = ()

    def round(self, state: ServerState, fed: Federation):
        previous = state.model
        state, metrics = super().round(state, fed)
        if state.model is previous:  # nobody replied: no step
            return state, metrics
        mean = state.model
        keys = floating(previous)
        moments = {
            name: state.extra.get(name) or {k: torch.zeros_like(previous[k]) for k in keys}
            for name in self.buffers
        }
        deltas = {k: mean[k] - previous[k] for k in keys}
        stepped = self.server_step(previous, deltas, moments, fed.round)
        state.model = {k: stepped.get(k, mean[k]) for k in mean}
        state.extra.update(moments)
        return state, metrics

    def server_step(
        self, model: Tensors, deltas: Tensors, moments: dict[str, Tensors], server_round: int
    ) -> Tensors:
        """The new floating tensors from the current ones, ``deltas`` (mean − current) and
        the ``moments`` (updated in place)."""
        raise NotImplementedError


class AdaptiveServerOptimizer(ServerOptimizer):
    """FedAdagrad / FedAdam / FedYogi (Reddi et al., Algorithm 2): first moment
    ``m ← β1·m + (1 − β1)·Δ``, second moment ``v`` by the subclass's rule, and
    ``x ← x + η·m / (√v + τ)``."""

    buffers = ("first_moment", "second_moment")

    def second_moment(self, v: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step_size(self, server_round: int) -> float:
        """η, or a subclass's corrected η for ``server_round`` (FedAdam's bias correction)."""
        return self.hp.server_lr

    def server_step(self, model, deltas, moments, server_round):
        beta1, tau = self.hp.beta1, self.hp.tau
        eta = self.step_size(server_round)
        first, second = moments["first_moment"], moments["second_moment"]
        out = {}
        for key, delta in deltas.items():
            first[key] = beta1 * first[key] + (1 - beta1) * delta
            second[key] = self.second_moment(second[key], delta)
            out[key] = model[key] + eta * first[key] / (second[key].sqrt() + tau)
        return out
