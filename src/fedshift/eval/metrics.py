"""Accuracy and model selection."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from fedshift.core.split import to_input
from fedshift.data.domains import Split

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


SELECTIONS = ("source-val", "last", "oracle")


def select_round(history: Sequence[dict], selection: str = "source-val") -> dict:
    """The history entry a model-selection rule picks (first best on ties).

    ``source-val``: best mean source-validation accuracy (DomainBed's training-domain
    validation, no target labels); ``last``: the final round; ``oracle``: best target
    accuracy (uses target labels, reported only as an upper bound on selection).
    """
    evaluated = [h for h in history if not math.isnan(h.get("target_accuracy", math.nan))]
    if not evaluated:
        raise ValueError("no evaluated round in the history")
    if selection == "last":
        return evaluated[-1]
    key = {"source-val": "source_val_accuracy", "oracle": "target_accuracy"}[selection]
    best = evaluated[0]
    for entry in evaluated[1:]:
        if entry[key] > best[key]:
            best = entry
    return best
