"""Classification accuracy of a model on a split (model selection is in engine.selection)."""

from __future__ import annotations

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
