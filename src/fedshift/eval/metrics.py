"""Classification accuracy of a model on a split (model selection is in engine.run.selection)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from fedshift.core.split import Split, to_input

Predict = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]


@torch.no_grad()
def accuracy(
    model: torch.nn.Module,
    split: Split,
    device: torch.device,
    predict: Predict,
    batch_size: int = 1000,
) -> float:
    """Top-1 accuracy of ``predict(model, x)`` on a labeled split (eval mode)."""
    if len(split) == 0:
        return float("nan")
    model.to(device).eval()
    correct = 0
    for start in range(0, len(split), batch_size):
        x = to_input(split.x[start : start + batch_size], device)
        y = split.y[start : start + batch_size].to(device)
        correct += int((predict(model, x).argmax(1) == y).sum())
    return correct / len(split)


def mean_or_nan(values: list[float]) -> float:
    """The mean, or NaN for no values."""
    return sum(values) / len(values) if values else float("nan")


def sample_std(values: list[float]) -> float:
    """The sample standard deviation (n - 1); 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    m = mean_or_nan(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))
