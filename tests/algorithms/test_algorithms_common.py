"""Building blocks shared by several algorithms (``fedshift.algorithms.toolkit``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedshift.algorithms.toolkit import proximal_penalty


def test_proximal_penalty_exact():
    layer = nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0]]))
        layer.bias.copy_(torch.tensor([0.0]))
    anchor = {"weight": torch.zeros(1, 2), "bias": torch.ones(1)}
    assert float(proximal_penalty(anchor, 0.5)(layer).detach()) == pytest.approx(0.25 * 6.0)
