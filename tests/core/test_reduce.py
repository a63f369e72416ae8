"""Exact-number tests of the aggregation rules on hand-made inputs."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedshift.core.reduce import RunningMean, mean, weighted_mean


def test_weighted_mean_exact_numbers():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor(0.0)}
    b = {"w": torch.tensor([3.0, 6.0]), "b": torch.tensor(4.0)}
    out = weighted_mean([a, b], [1, 3])
    assert torch.equal(out["w"], torch.tensor([2.5, 5.0]))
    assert torch.equal(out["b"], torch.tensor(3.0))


def test_weighted_mean_batchnorm_buffers():
    bn1 = torch.nn.BatchNorm1d(2)
    bn2 = torch.nn.BatchNorm1d(2)
    with torch.no_grad():
        bn1.running_mean.copy_(torch.tensor([0.0, 1.0]))
        bn2.running_mean.copy_(torch.tensor([4.0, 5.0]))
        bn1.running_var.copy_(torch.tensor([1.0, 1.0]))
        bn2.running_var.copy_(torch.tensor([3.0, 9.0]))
    bn1.num_batches_tracked.fill_(10)
    bn2.num_batches_tracked.fill_(20)
    out = weighted_mean([bn1.state_dict(), bn2.state_dict()], [3, 1])
    assert torch.equal(out["running_mean"], torch.tensor([1.0, 2.0]))
    assert torch.equal(out["running_var"], torch.tensor([1.5, 3.0]))
    assert out["num_batches_tracked"].dtype == torch.long
    assert int(out["num_batches_tracked"]) == 12  # 0.75*10 + 0.25*20 = 12.5 -> round half even
    assert set(out) == set(bn1.state_dict())


def test_mean_is_unweighted_and_keeps_dtype():
    items = [
        {"x": torch.tensor([1.0], dtype=torch.float16)},
        {"x": torch.tensor([2.0], dtype=torch.float16)},
    ]
    out = mean(items)
    assert out["x"].dtype == torch.float16
    assert float(out["x"]) == 1.5


@pytest.mark.parametrize(
    "items,weights,match",
    [
        ([], [], "at least one"),
        ([{"x": torch.zeros(1)}], [1, 2], "weights"),
        ([{"x": torch.zeros(1)}, {"y": torch.zeros(1)}], [1, 1], "different keys"),
        ([{"x": torch.zeros(1)}, {"x": torch.zeros(2)}], [1, 1], "shape mismatch"),
        ([{"x": torch.zeros(1)}], [0], "positive sum"),
    ],
)
def test_weighted_mean_rejects_bad_input(items, weights, match):
    with pytest.raises(ValueError, match=match):
        weighted_mean(items, weights)


def test_running_mean_folds_items_one_at_a_time_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    items = [{"w": torch.randn(5, 3, generator=gen), "n": torch.tensor(i)} for i in range(7)]
    weights = [3, 1, 4, 1, 5, 9, 2]
    running = RunningMean()
    for item, weight in zip(items, weights, strict=True):
        running.add(item, weight)
    out, expected = running.result(), weighted_mean(items, weights)
    assert running.count == 7
    assert all(torch.equal(out[k], expected[k]) for k in expected)
    # the rule: float64 sum of weight x value, divided by the total weight once
    exact = sum(w * item["w"].double() for item, w in zip(items, weights, strict=True)) / 25
    assert torch.equal(out["w"], exact.float())


@settings(max_examples=50, deadline=None)
@given(
    value=st.lists(st.floats(-1e6, 1e6, width=32), min_size=1, max_size=6),
    weights=st.lists(st.integers(1, 10**6), min_size=1, max_size=8),
)
def test_the_mean_of_copies_is_the_value_itself(value, weights):
    item = {"x": torch.tensor(value, dtype=torch.float32)}
    out = weighted_mean([item] * len(weights), weights)
    assert torch.equal(out["x"], item["x"])


@pytest.mark.parametrize("weight", [-1.0, float("nan"), float("inf")])
def test_running_mean_refuses_a_bad_weight(weight):
    with pytest.raises(ValueError, match="finite and non-negative"):
        RunningMean().add({"x": torch.zeros(1)}, weight)


def test_running_mean_without_items_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        RunningMean().result()
