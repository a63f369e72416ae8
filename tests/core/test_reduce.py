"""Exact-number tests of the aggregation rules on hand-made inputs."""

import pytest
import torch

from fedshift.core.reduce import mean, weighted_mean


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
