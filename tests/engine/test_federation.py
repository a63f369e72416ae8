"""The simulated federation's reply shape checks."""

from __future__ import annotations

import torch

from fedshift.core.record import Kind, Record
from fedshift.engine.federation import check_shapes


def test_per_sample_arrays_may_differ_in_length():
    shares = {"amplitude": Kind.AMPLITUDE, "model": Kind.MODEL}
    replies = {
        0: Record(arrays={"amplitude.window": torch.zeros(3, 3, 3, 3), "model.w": torch.zeros(2)}),
        1: Record(arrays={"amplitude.window": torch.zeros(5, 3, 3, 3), "model.w": torch.zeros(2)}),
        2: Record(arrays={"amplitude.window": torch.zeros(4, 3, 1, 1), "model.w": torch.zeros(3)}),
    }
    assert set(check_shapes(replies, shares)) == {2}
    assert set(check_shapes(replies)) == {1, 2}  # without shares every dimension must agree
