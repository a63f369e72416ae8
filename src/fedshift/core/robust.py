"""Robust aggregation: the run keys ``aggregator``, ``aggregator_f`` and ``trim_beta``.

Every rule maps the clients' items (named tensors: a state dict, one class's prototype, a
part of a model) to one item of the same keys, shapes and dtypes:

* ``mean``: today's weighted mean (:func:`fedshift.core.reduce.weighted_mean`), bit for bit;
* ``median``: the coordinate-wise median (the mean of the two middle values for even n);
* ``trimmed-mean``: per coordinate, the mean after dropping the ⌊βn⌋ largest and the ⌊βn⌋
  smallest values (β = ``trim_beta`` in [0, 0.5), so 2⌊βn⌋ < n for every n; it tolerates
  ⌊βn⌋ attackers, none when ⌊βn⌋ = 0);
* ``krum``: the item with the smallest score, the sum of squared distances to its n − f − 2
  nearest items (Blanchard et al., NeurIPS 2017; needs n ≥ 2f + 3);
* ``multi-krum``: the mean of the m = n − f items with the smallest scores;
* ``bulyan``: θ = n − 2f items selected by Krum one after another (each pick leaves the
  pool), then per coordinate the mean of the β = θ − 2f selected values closest to their
  median (El Mhamdi et al., ICML 2018; needs n ≥ 4f + 3).

f is ``aggregator_f``, the number of Byzantine clients the rule must withstand. Distances
(Krum, Bulyan) are over the whole flattened item, in float64. The robust rules ignore the
aggregation weights (sample counts, FedGA's or FADA's weights): a malicious client could
claim any weight it likes, so only ``mean`` weighs. Floating tensors are combined in float64
and cast back; integer tensors (BatchNorm ``num_batches_tracked``) get the rounded result.

**How algorithms receive the rule.** The rule is part of the run an algorithm is told about,
``self.run.aggregator`` (:class:`~fedshift.core.algorithm.RunInfo`), built by the engine from
the run config. Algorithms call it where they used to call ``weighted_mean`` (and pass it to
the shared helpers ``average_replies`` / ``averaging_round`` / ``aggregate_prototypes``,
which take it as a required argument, so a new call site cannot forget it). We chose this
over a rule installed around the round by the runner (a context variable) because it keeps
the server program a pure function of its inputs, needs no engine import in an algorithm,
behaves the same in both engines (the Flower ServerApp builds the same ``RunInfo``) and
makes the choice visible at each call site.

A rule that gets too few items raises :class:`AggregationError`, a
:class:`~fedshift.core.errors.RoundFailed`: the run stops like any failed round (client
states restored, resumable). :meth:`Aggregator.check_clients` makes the same check before
any work, where the engine knows how many clients a round samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from fedshift.core.aggregator_names import AGGREGATORS
from fedshift.core.errors import ConfigError, RoundFailed, did_you_mean
from fedshift.core.reduce import Tensors, mean, weighted_mean


class AggregationError(RoundFailed):
    """A robust rule got fewer items than its Byzantine bound needs."""


@dataclass(frozen=True)
class Aggregator:
    """One aggregation rule with its parameters; call it on ``(items, weights)``."""

    name: str = "mean"
    f: int = 1  # assumed Byzantine clients (Krum, Multi-Krum, Bulyan)
    beta: float = 0.1  # trimmed share on each side (trimmed mean)

    def __post_init__(self) -> None:
        check_aggregator_values(self.name, self.f, self.beta)

    @property
    def is_mean(self) -> bool:
        return self.name == "mean"

    def min_items(self) -> int:
        """The fewest items the rule accepts (its Byzantine bound)."""
        if self.name in ("krum", "multi-krum"):
            return 2 * self.f + 3
        if self.name == "bulyan":
            return 4 * self.f + 3
        return 1

    def problem(self, n: int) -> str | None:
        """Why ``n`` items cannot be aggregated by this rule, or None."""
        if n < 1:
            return "no items to aggregate"
        if n < self.min_items():
            bound = "2f+3" if self.name in ("krum", "multi-krum") else "4f+3"
            return (
                f"aggregator={self.name} with aggregator_f={self.f} needs n >= {bound} = "
                f"{self.min_items()} clients, got {n}"
            )
        return None

    def check_clients(self, n: int, what: str = "clients per round") -> None:
        """Raise ConfigError before any work when ``n`` sampled clients are too few."""
        problem = self.problem(n)
        if problem:
            raise ConfigError(
                f"{problem} ({what}); lower aggregator_f, choose another aggregator or add clients"
            )

    def __call__(self, items: Sequence[Tensors], weights: Sequence[float]) -> dict:
        """The aggregate of ``items``; ``weights`` are used by ``mean`` only."""
        if self.is_mean:
            return weighted_mean(items, weights)
        if len(items) != len(weights):
            raise ValueError(f"{len(items)} items but {len(weights)} weights")
        problem = self.problem(len(items))
        if problem:
            raise AggregationError(problem)
        keys = check_keys(items)
        stacked = stack(items, keys)
        if self.name in ("krum", "multi-krum"):
            scores = krum_scores(stacked, self.f)
            if self.name == "krum":
                return clone(items[int(torch.argmin(scores))])
            best = torch.argsort(scores, stable=True)[: len(items) - self.f]
            return mean([items[int(i)] for i in sorted(best.tolist())])
        if self.name == "median":
            flat = coordinate_median(stacked)
        elif self.name == "trimmed-mean":
            flat = trimmed_mean(stacked, math.floor(self.beta * len(items)))
        elif self.name == "bulyan":
            flat = bulyan(stacked, self.f)
        else:
            raise ValueError(f"unknown aggregator {self.name!r}")
        return unflatten(flat, items[0], keys)


def check_keys(items: Sequence[Tensors]) -> list[str]:
    """The items' common keys (in the first item's order); shapes must agree."""
    keys = list(items[0].keys())
    for i, item in enumerate(items[1:], start=1):
        if list(item.keys()) != keys:
            raise ValueError(f"item {i} has different keys: {sorted(set(keys) ^ set(item))[:5]}")
        for key in keys:
            if item[key].shape != items[0][key].shape:
                raise ValueError(
                    f"shape mismatch for {key!r}: {tuple(item[key].shape)} vs "
                    f"{tuple(items[0][key].shape)}"
                )
    return keys


def stack(items: Sequence[Tensors], keys: list[str]) -> torch.Tensor:
    """``(n, d)`` float64: each item's tensors flattened and concatenated in ``keys`` order."""
    return torch.stack(
        [
            torch.cat([item[k].detach().to("cpu", torch.float64).reshape(-1) for k in keys])
            if keys
            else torch.zeros(0, dtype=torch.float64)
            for item in items
        ]
    )


def unflatten(flat: torch.Tensor, like: Tensors, keys: list[str]) -> dict[str, torch.Tensor]:
    """Cut a flat float64 vector back into ``like``'s shapes and dtypes (integers rounded)."""
    out: dict[str, torch.Tensor] = {}
    start = 0
    for key in keys:
        ref = like[key]
        part = flat[start : start + ref.numel()].reshape(ref.shape)
        start += ref.numel()
        out[key] = part.to(ref.dtype) if ref.is_floating_point() else part.round().to(ref.dtype)
    return out


def clone(item: Tensors) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").clone() for k, v in item.items()}


def coordinate_median(stacked: torch.Tensor) -> torch.Tensor:
    """Per column of ``(n, d)``: the middle value, or the mean of the two middle ones."""
    ordered = torch.sort(stacked, dim=0).values
    n = ordered.shape[0]
    if n % 2:
        return ordered[n // 2]
    return (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def trimmed_mean(stacked: torch.Tensor, trim: int) -> torch.Tensor:
    """Per column: the mean after dropping the ``trim`` largest and ``trim`` smallest values."""
    ordered = torch.sort(stacked, dim=0).values
    return ordered[trim : ordered.shape[0] - trim].mean(dim=0)


def krum_scores(stacked: torch.Tensor, f: int) -> torch.Tensor:
    """Each row's sum of squared distances to its n − f − 2 nearest other rows (at least 1
    neighbour, so Bulyan's last picks still compare items)."""
    n = stacked.shape[0]
    if n == 1:
        return torch.zeros(1, dtype=torch.float64)
    squared = torch.cdist(stacked, stacked).pow(2)
    squared.fill_diagonal_(float("inf"))
    neighbours = min(max(n - f - 2, 1), n - 1)
    return torch.sort(squared, dim=1).values[:, :neighbours].sum(dim=1)


def bulyan(stacked: torch.Tensor, f: int) -> torch.Tensor:
    """El Mhamdi et al.'s rule over the ``(n, d)`` rows (see the module docstring)."""
    pool = list(range(stacked.shape[0]))
    selected = []
    for _ in range(stacked.shape[0] - 2 * f):
        scores = krum_scores(stacked[pool], f)
        selected.append(pool.pop(int(torch.argmin(scores))))
    chosen = stacked[sorted(selected)]
    keep = chosen.shape[0] - 2 * f
    median = coordinate_median(chosen)
    closest = torch.argsort((chosen - median).abs(), dim=0, stable=True)[:keep]
    return torch.gather(chosen, 0, closest).mean(dim=0)


def check_aggregator_values(name: str, f: int, beta: float) -> None:
    """The registry-free checks of the run keys (choices and ranges)."""
    if name not in AGGREGATORS:
        raise ConfigError(
            f"unknown aggregator {name!r}{did_you_mean(name, AGGREGATORS)}; "
            f"choose one of: {', '.join(AGGREGATORS)}"
        )
    if f < 0:
        raise ConfigError(f"aggregator_f must be >= 0, got {f}")
    if not 0 <= beta < 0.5:
        raise ConfigError(f"trim_beta must be in [0, 0.5), got {beta}")
