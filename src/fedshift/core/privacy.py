"""Differential privacy per kind of share: central DP for models, clipped noisy prototypes.

``MODEL`` replies (DP-FedAvg, McMahan et al., ICLR 2018, with a fixed number of clients per
round): each client's update ``Δ_i = m_i − g`` (every floating tensor of the state dict) is
clipped to L2 norm ``C`` as one vector, the server averages the clipped updates uniformly over
the ``n`` clients actually aggregated and adds Gaussian noise of standard deviation
``z · C / n`` per coordinate — the mean's sensitivity to one client is ``C / n``, so the noise
multiplier ``z`` is relative to it. Integer buffers (BatchNorm ``num_batches_tracked``) carry
no information about the data beyond the round count and keep the global value.

``PROTOTYPE`` replies: a client withholds every class it holds fewer than ``min_count``
examples of (a prototype of very few images is close to those images) and clips its whole
set of prototypes JOINTLY to norm ``C`` (all classes as one vector: a client sending ``k``
prototypes each clipped to ``C`` alone would move the release by up to ``√k · C``, and the
accountant's ε would be too small); the server clips each client's set jointly again and
releases EVERY class ``0 .. K−1`` every round as ``(Σ_i p_i(c) + N(0, (z·C)²)) / m``, with
``m`` the number of clients the round sampled — DP-FedAvg's fixed-denominator estimator. A
class nobody sent is released as noise alone. Neither the set of released classes, nor the
denominator, nor the noise depends on what the clients hold, so one client (its
contribution present or zeroed) moves the release, all classes as one vector, by at most
``C / m`` against noise ``z · C / m``: the accountant's multiplier ``z`` is the release's
true one. (A denominator ``n_c`` = the clients that sent class ``c``, and a release of the
sent classes only, leaked both: a lone holder of a class made it appear, a duplicate
prototype halved the noise's standard deviation.)

The privacy loss of the run is tracked with Opacus's RDP accountant: one step per round with
sampling rate ``sampled clients / all clients`` and noise multiplier ``z``, ε reported at the
run's ``δ``. The guarantee is client-level and assumes an honest-but-curious server that adds
the noise (central DP).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

Tensors = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class PrivacySettings:
    """The run's DP parameters (run keys ``dp_clip``, ``dp_noise``, ``dp_delta``,
    ``dp_min_count``)."""

    clip: float
    noise_multiplier: float
    delta: float = 1e-5
    min_count: int = 5


def update_norm(update: Tensors) -> float:
    """L2 norm of all floating tensors of ``update`` taken as one vector."""
    total = sum(
        float(t.detach().to(torch.float64).pow(2).sum())
        for t in update.values()
        if t.is_floating_point()
    )
    return math.sqrt(total)


def clip_update(update: Tensors, clip: float) -> dict[str, torch.Tensor]:
    """``update`` scaled by ``min(1, clip / ‖update‖)`` (floating tensors; others as given)."""
    if clip <= 0:
        raise ValueError(f"clip must be positive, got {clip}")
    norm = update_norm(update)
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    return {
        k: (t.detach().to(torch.float64) * scale if t.is_floating_point() else t)
        for k, t in update.items()
    }


class PrivateMean:
    """DP-FedAvg's server step accumulated one client model at a time: each update
    ``m_i − g`` is clipped to ``clip`` and added to a float64 sum as it arrives (a round
    holds the sum, not every model); :meth:`result` divides by ``denominator`` and adds the
    Gaussian noise. ``denominator`` is the number of clients the round sampled, fixed
    before any client replies (DP-FedAvg's fixed-denominator estimator): a client that
    fails counts as a zero update, so neither the mean's scale nor the noise depends on
    who replied. ``None`` divides by the models added (only for callers whose count is
    fixed in advance, such as a hand-made list)."""

    def __init__(self, global_model: Tensors, clip: float, denominator: int | None = None):
        if denominator is not None and denominator < 1:
            raise ValueError(f"denominator must be a positive client count, got {denominator}")
        self.global_model = global_model
        self.clip = clip
        self.denominator = denominator
        self.sums = {k: torch.zeros(v.shape, dtype=torch.float64) for k, v in global_model.items()}
        self.count = 0

    def add(self, model: Tensors) -> None:
        if self.denominator is not None and self.count >= self.denominator:
            raise ValueError(f"more client models than the denominator {self.denominator}")
        update = {
            k: model[k].detach().to(torch.float64) - g.detach().to(torch.float64)
            for k, g in self.global_model.items()
            if g.is_floating_point()
        }
        for k, value in clip_update(update, self.clip).items():
            self.sums[k] += value
        self.count += 1

    def result(self, noise_multiplier: float, generator: torch.Generator) -> dict:
        """``g + Σ_i clip(m_i − g) / m + N(0, (z·C/m)²)``, m the denominator."""
        if not self.count:
            raise ValueError("private_model_mean needs at least one client model")
        n = self.count if self.denominator is None else self.denominator
        sigma = noise_multiplier * self.clip / n
        out: dict[str, torch.Tensor] = {}
        for k, g in self.global_model.items():
            if not g.is_floating_point():
                out[k] = g.clone()
                continue
            noise = torch.randn(g.shape, generator=generator, dtype=torch.float64) * sigma
            out[k] = (g.detach().to(torch.float64) + self.sums[k] / n + noise).to(g.dtype)
        return out


def private_model_mean(
    global_model: Tensors,
    client_models: Sequence[Tensors],
    clip: float,
    noise_multiplier: float,
    generator: torch.Generator,
    denominator: int | None = None,
) -> dict[str, torch.Tensor]:
    """The new global model: ``g + Σ_i clip(m_i − g) / m + N(0, (z·C/m)²)``, with m the
    ``denominator`` (the round's sampled count; default: the number of models)."""
    running = PrivateMean(global_model, clip, denominator)
    for model in client_models:
        running.add(model)
    return running.result(noise_multiplier, generator)


def withhold_and_clip_prototypes(
    prototypes: Mapping[int, torch.Tensor],
    counts: Mapping[int, int],
    clip: float,
    min_count: int,
) -> tuple[dict[int, torch.Tensor], dict[int, int]]:
    """The client side: drop classes with fewer than ``min_count`` examples, clip the
    remaining prototypes jointly to norm ``clip``."""
    kept = {label: p for label, p in prototypes.items() if counts.get(label, 0) >= min_count}
    clipped = clip_prototype_set(kept, clip)
    kept_protos = {label: clipped[label].to(proto.dtype) for label, proto in kept.items()}
    return kept_protos, {label: int(counts[label]) for label in kept}


def clip_prototype_set(table: Mapping[int, torch.Tensor], clip: float) -> dict[int, torch.Tensor]:
    """One client's prototypes (float64) scaled together by ``min(1, C / ‖(p_1, …, p_k)‖)``:
    the set's norm, all classes as one vector, is at most ``clip``."""
    if clip <= 0:
        raise ValueError(f"clip must be positive, got {clip}")
    values = {label: proto.detach().to(torch.float64) for label, proto in table.items()}
    norm = math.sqrt(sum(float(v.square().sum()) for v in values.values()))
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    return {label: value * scale for label, value in values.items()}


def private_prototype_mean(
    tables: Sequence[Mapping[int, torch.Tensor]],
    clip: float,
    noise_multiplier: float,
    generator: torch.Generator,
    *,
    num_classes: int,
    dim: int,
    denominator: int,
) -> dict[int, torch.Tensor]:
    """The server side: for every class ``c`` in ``0 .. num_classes − 1``,
    ``(Σ_i p_i(c) + N(0, (z·C)²)) / denominator`` over the (jointly re-clipped) sets of the
    clients that sent ``c`` — noise alone for a class nobody sent. ``denominator`` is the
    number of clients the round sampled, fixed before any client replies: a failed client
    or one without the class counts as a zero contribution. Each client's set is clipped
    jointly again, so a client that skipped clipping gains nothing."""
    if denominator < 1:
        raise ValueError(f"denominator must be a positive client count, got {denominator}")
    if len(tables) > denominator:
        raise ValueError(f"{len(tables)} prototype sets for a denominator of {denominator}")
    sums = {c: torch.zeros(dim, dtype=torch.float64) for c in range(num_classes)}
    for table in tables:
        for label, value in clip_prototype_set(table, clip).items():
            if label not in sums or value.shape != (dim,):
                raise ValueError(
                    f"prototype of class {label} with shape {tuple(value.shape)}; expected a "
                    f"class below {num_classes} and shape ({dim},)"
                )
            sums[label] += value
    out = {}
    for label, total in sums.items():
        noise = torch.randn(dim, generator=generator, dtype=torch.float64)
        out[label] = ((total + noise * (noise_multiplier * clip)) / denominator).to(torch.float32)
    return out


class PrivacyAccountant:
    """ε of the run so far, from Opacus's RDP accountant (one step per aggregated round)."""

    def __init__(self, noise_multiplier: float, delta: float):
        from opacus.accountants import RDPAccountant

        if noise_multiplier <= 0:
            raise ValueError(f"noise_multiplier must be positive, got {noise_multiplier}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        self.noise_multiplier, self.delta = noise_multiplier, delta
        self._accountant = RDPAccountant()

    def step(self, sample_rate: float) -> None:
        """Account one round in which a ``sample_rate`` share of the clients was sampled."""
        self._accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=sample_rate)

    @property
    def rounds(self) -> int:
        return sum(steps for _, _, steps in self._accountant.history)

    def epsilon(self) -> float:
        """ε at this accountant's δ (0 before the first round)."""
        if not self._accountant.history:
            return 0.0
        return float(self._accountant.get_epsilon(delta=self.delta))

    def state(self) -> list[tuple[float, float, int]]:
        """The history to checkpoint: ``(noise_multiplier, sample_rate, steps)`` entries."""
        return [tuple(entry) for entry in self._accountant.history]

    def load(self, history: Sequence[Sequence[float]]) -> None:
        """Restore a checkpointed history (``--resume``)."""
        self._accountant.history = [(float(z), float(q), int(s)) for z, q, s in history]


def run_epsilon(settings: PrivacySettings, rounds: int, sample_rate: float) -> float:
    """ε after ``rounds`` rounds that each sampled a ``sample_rate`` share of the clients."""
    accountant = PrivacyAccountant(settings.noise_multiplier, settings.delta)
    if rounds > 0:
        accountant.load([(settings.noise_multiplier, sample_rate, rounds)])
    return accountant.epsilon()
