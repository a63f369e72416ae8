"""FADA: its losses, the MINE bound, attention weights and dispersion (exact numbers)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedshift.algorithms.fada import (
    attention_weights,
    log_dispersion,
    mine_lower_bound,
    negative_entropy,
)


def test_fada_losses_and_attention():
    assert negative_entropy(torch.zeros(3, 4)).item() == pytest.approx(-math.log(4.0))
    statistics = nn.Linear(2, 1)
    with torch.no_grad():
        statistics.weight.copy_(torch.tensor([[1.0, 0.0]]))  # T(p, q) = p
        statistics.bias.zero_()
    p, q = torch.tensor([[1.0], [2.0]]), torch.tensor([[0.0], [5.0]])
    bound = mine_lower_bound(statistics, p, q, torch.tensor([1, 0]))
    expected = 1.5 - (math.log(math.e + math.e**2) - math.log(2.0))
    assert bound.item() == pytest.approx(expected, rel=1e-6)
    assert attention_weights([0.0, math.log(3.0)]) == pytest.approx([0.25, 0.75])
    x = torch.tensor([[0.0], [2.0], [10.0], [12.0]])
    assert log_dispersion(x, 2, 10, torch.Generator().manual_seed(0)) == pytest.approx(
        math.log(4.0)
    )
