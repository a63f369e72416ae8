"""Pure aggregation rules over named tensors (state dicts, prototype tables)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

Tensors = Mapping[str, torch.Tensor]


class RunningMean:
    """A weighted mean of named tensors accumulated one item at a time.

    Each item is added to a float64 running sum, weight times value, and may be dropped
    right after; :meth:`result` divides by the total weight. The server can thus fold each
    client's reply as it arrives instead of holding every reply until the last one (a
    600-client round holds one model's sums, not 600 models). The products of a float32
    value and a sample count are exact in float64, so only the sum and the final division
    round. Floating tensors are cast back to their dtype; integer tensors (BatchNorm
    ``num_batches_tracked``) get the rounded weighted mean, so every buffer of a BatchNorm
    layer is aggregated explicitly rather than dropped.
    """

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self._like: dict[str, torch.Tensor] = {}
        self._weights: list[float] = []
        self.count = 0

    def add(self, item: Tensors, weight: float) -> None:
        """Fold ``item`` in with ``weight`` (>= 0); its keys and shapes must match the first."""
        weight = float(weight)
        if not weight >= 0 or weight == float("inf"):
            raise ValueError(f"weights must be finite and non-negative, got {weight}")
        if not self.count:
            self._like = {key: torch.empty(0, dtype=value.dtype) for key, value in item.items()}
            self._sums = {
                key: torch.zeros(value.shape, dtype=torch.float64) for key, value in item.items()
            }
        elif list(item.keys()) != list(self._like):
            missing = set(self._like) ^ set(item.keys())
            raise ValueError(f"item {self.count} has different keys: {sorted(missing)[:5]}")
        for key, acc in self._sums.items():
            tensor = item[key]
            if tuple(tensor.shape) != tuple(acc.shape):
                raise ValueError(
                    f"shape mismatch for {key!r}: {tuple(tensor.shape)} vs {tuple(acc.shape)}"
                )
        for key, acc in self._sums.items():
            # product then sum, two roundings at most, the same on every CPU (no fused op)
            scaled = item[key].detach().to("cpu", torch.float64, copy=True)
            acc.add_(scaled.mul_(weight))
        self._weights.append(weight)
        self.count += 1

    def result(self) -> dict[str, torch.Tensor]:
        """The weighted mean of every item added so far."""
        if not self.count:
            raise ValueError("weighted_mean needs at least one item")
        total = sum(self._weights)
        if total <= 0:
            raise ValueError(
                f"weights must be non-negative with a positive sum, got {self._weights}"
            )
        out: dict[str, torch.Tensor] = {}
        for key, acc in self._sums.items():
            dtype = self._like[key].dtype
            value = acc / total
            out[key] = value.to(dtype) if dtype.is_floating_point else value.round().to(dtype)
        return out


def weighted_mean(items: Sequence[Tensors], weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """Weighted mean of each named tensor, weights normalized to sum 1 (one
    :class:`RunningMean` over ``items`` in order, so folding replies as they arrive gives
    the same bits)."""
    if not items:
        raise ValueError("weighted_mean needs at least one item")
    if len(items) != len(weights):
        raise ValueError(f"{len(items)} items but {len(weights)} weights")
    values = [float(x) for x in weights]
    if any(not w >= 0 for w in values) or sum(values) <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {list(weights)}")
    running = RunningMean()
    for item, weight in zip(items, values, strict=True):
        running.add(item, weight)
    return running.result()


def mean(items: Sequence[Tensors]) -> dict[str, torch.Tensor]:
    """Unweighted mean of each named tensor."""
    return weighted_mean(items, [1.0] * len(items))
