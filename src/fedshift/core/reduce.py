"""Pure aggregation rules over named tensors (state dicts, prototype tables)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

Tensors = Mapping[str, torch.Tensor]


def weighted_mean(items: Sequence[Tensors], weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """Weighted mean of each named tensor, weights normalized to sum 1.

    Floating tensors (weights, BatchNorm running mean/var) are averaged in float64 and cast
    back; integer tensors (BatchNorm ``num_batches_tracked``) get the rounded weighted mean,
    so every buffer of a BatchNorm layer is aggregated explicitly rather than dropped.
    """
    if not items:
        raise ValueError("weighted_mean needs at least one item")
    if len(items) != len(weights):
        raise ValueError(f"{len(items)} items but {len(weights)} weights")
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)
    if bool((w < 0).any()) or float(w.sum()) <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {list(weights)}")
    w = w / w.sum()
    keys = list(items[0].keys())
    for i, item in enumerate(items[1:], start=1):
        if list(item.keys()) != keys:
            missing = set(keys) ^ set(item.keys())
            raise ValueError(f"item {i} has different keys: {sorted(missing)[:5]}")
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        ref = items[0][key]
        acc = torch.zeros(ref.shape, dtype=torch.float64)
        for weight, item in zip(w, items, strict=True):
            tensor = item[key]
            if tensor.shape != ref.shape:
                raise ValueError(
                    f"shape mismatch for {key!r}: {tuple(tensor.shape)} vs {tuple(ref.shape)}"
                )
            acc += weight * tensor.detach().to("cpu", torch.float64)
        out[key] = acc.to(ref.dtype) if ref.is_floating_point() else acc.round().to(ref.dtype)
    return out


def mean(items: Sequence[Tensors]) -> dict[str, torch.Tensor]:
    """Unweighted mean of each named tensor."""
    return weighted_mean(items, [1.0] * len(items))
