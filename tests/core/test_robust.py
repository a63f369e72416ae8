"""Robust aggregation rules: exact numbers on hand-made inputs, their Byzantine bounds, and
the property that bounded attackers cannot push the result outside the honest range."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedshift.core.errors import ConfigError, RoundFailed
from fedshift.core.reduce import weighted_mean
from fedshift.core.robust import AggregationError, Aggregator, check_aggregator_values


def items_of(*rows):
    """One item per row: ``{"w": tensor(row)}``."""
    return [{"w": torch.tensor(row, dtype=torch.float64)} for row in rows]


def combine(rule: Aggregator, items):
    return rule(items, [1.0] * len(items))["w"].tolist()


def test_mean_is_todays_weighted_mean_bit_for_bit():
    items = [{"w": torch.randn(5, 3), "n": torch.tensor(i)} for i in range(4)]
    weights = [3, 1, 4, 1]
    expected = weighted_mean(items, weights)
    got = Aggregator("mean")(items, weights)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_median_odd_and_even():
    odd = items_of([1, 10], [2, 20], [3, 30], [4, 40], [100, -100])
    assert combine(Aggregator("median"), odd) == [3, 20]
    even = items_of([1, 10], [2, 20], [3, 30], [100, -100])
    # sorted columns [1, 2, 3, 100] and [-100, 10, 20, 30]: the two middle values' mean
    assert combine(Aggregator("median"), even) == [2.5, 15]


def test_trimmed_mean_drops_floor_beta_n_each_side():
    items = items_of([0], [1], [2], [3], [10], [100])
    # floor(0.2 * 6) = 1: drop 0 and 100 -> (1 + 2 + 3 + 10) / 4
    assert combine(Aggregator("trimmed-mean", beta=0.2), items) == [4]
    # floor(0.34 * 6) = 2: drop 0, 1 and 10, 100 -> (2 + 3) / 2
    assert combine(Aggregator("trimmed-mean", beta=0.34), items) == [2.5]


def test_krum_and_multi_krum():
    items = items_of([0], [1], [3], [7], [20])
    # n=5, f=1: each score sums the squared distances to the 2 nearest others:
    # 0 -> 1+9=10, 1 -> 1+4=5, 3 -> 4+9=13, 7 -> 16+36=52, 20 -> 169+289=458
    assert combine(Aggregator("krum", f=1), items) == [1]
    # Multi-Krum averages the m = n - f = 4 best: (0 + 1 + 3 + 7) / 4
    assert combine(Aggregator("multi-krum", f=1), items) == [2.75]


def test_krum_returns_a_clients_item_unchanged():
    items = [{"w": torch.tensor([0.5, 1.5]), "n": torch.tensor(7)} for _ in range(5)]
    items[3] = {"w": torch.tensor([9.0, 9.0]), "n": torch.tensor(2)}
    out = Aggregator("krum", f=1)(items, [1.0] * 5)
    assert torch.equal(out["w"], items[0]["w"]) and out["n"].dtype == torch.int64


def test_bulyan_selects_by_krum_then_keeps_the_values_nearest_the_median():
    # n=7, f=1: theta = 5 picks by iterated Krum (neighbours 4, 3, 2, then at least 1;
    # ties to the lowest index): 2.5 (31), 4 (34), 1 (37), 0 (58, tie with 7), 7 (1858,
    # tie with 50). The outliers 50 and -40 are never picked. Per coordinate the
    # beta = theta - 2f = 3 values nearest the median: {1, 2.5, 4} -> 2.5 and {10, 10, 10}
    items = items_of([0, 10], [1, 10], [2.5, 10], [4, 10], [7, 13], [50, 10], [-40, 10])
    assert combine(Aggregator("bulyan", f=1), items) == [2.5, 10]


@pytest.mark.parametrize("rule", ["median", "trimmed-mean", "krum", "multi-krum", "bulyan"])
def test_shapes_and_dtypes_are_kept_and_integers_rounded(rule):
    items = [
        {
            "weight": torch.full((2, 3), float(i), dtype=torch.float32),
            "half": torch.full((4,), float(i), dtype=torch.float16),
            "num_batches_tracked": torch.tensor(10 + i),
        }
        for i in range(7)
    ]
    out = Aggregator(rule, f=1, beta=0.2)(items, [1.0] * 7)
    for key, ref in items[0].items():
        assert out[key].shape == ref.shape and out[key].dtype == ref.dtype
    assert 10 <= int(out["num_batches_tracked"]) <= 16
    assert 0.0 <= float(out["weight"][0, 0]) <= 6.0


@pytest.mark.parametrize(
    ("rule", "fewest"),
    [("krum", 5), ("multi-krum", 5), ("bulyan", 7)],
)
def test_byzantine_bounds_at_aggregation_time(rule, fewest):
    aggregator = Aggregator(rule, f=1)
    assert aggregator.min_items() == fewest
    aggregator(items_of(*[[i] for i in range(fewest)]), [1.0] * fewest)
    with pytest.raises(AggregationError, match=f"needs n >= .* = {fewest}") as caught:
        aggregator(items_of(*[[i] for i in range(fewest - 1)]), [1.0] * (fewest - 1))
    assert isinstance(caught.value, RoundFailed)  # the runner's failed-round path


def test_check_clients_is_a_config_error_naming_the_bound():
    with pytest.raises(ConfigError, match="aggregator=bulyan with aggregator_f=2 needs n >= 4f"):
        Aggregator("bulyan", f=2).check_clients(10)
    Aggregator("bulyan", f=2).check_clients(11)


@pytest.mark.parametrize(
    ("name", "f", "beta", "message"),
    [
        ("krumm", 1, 0.1, "did you mean 'krum'"),
        ("median", -1, 0.1, "aggregator_f must be >= 0"),
        ("trimmed-mean", 1, 0.5, r"trim_beta must be in \[0, 0.5\)"),
    ],
)
def test_run_key_values(name, f, beta, message):
    with pytest.raises(ConfigError, match=message):
        check_aggregator_values(name, f, beta)
    with pytest.raises(ConfigError, match=message):
        Aggregator(name, f, beta)


def largest_tolerated(rule: str, n: int, beta: float) -> int:
    """The most attackers the rule tolerates among n items."""
    if rule == "median":
        return (n - 1) // 2
    if rule == "trimmed-mean":
        return math.floor(beta * n)
    if rule == "bulyan":
        return (n - 3) // 4
    return (n - 3) // 2


@settings(max_examples=60, deadline=None)
@given(
    rule=st.sampled_from(["median", "trimmed-mean", "krum", "multi-krum", "bulyan"]),
    n=st.integers(3, 11),
    dim=st.integers(1, 4),
    beta=st.sampled_from([0.1, 0.2, 0.3, 0.45]),
    data=st.data(),
)
def test_bounded_attackers_stay_inside_the_honest_range(rule, n, dim, beta, data):
    f_max = largest_tolerated(rule, n, beta)
    if rule in ("krum", "multi-krum", "bulyan") and f_max < 0:
        return
    attackers = data.draw(st.integers(0, max(f_max, 0)), label="attackers")
    honest_values = st.floats(-100, 100, allow_nan=False, width=32)
    honest = [
        data.draw(st.lists(honest_values, min_size=dim, max_size=dim), label="honest")
        for _ in range(n - attackers)
    ]
    signs = st.sampled_from([1e9, -1e9])
    evil = [
        data.draw(st.lists(signs, min_size=dim, max_size=dim), label="evil")
        for _ in range(attackers)
    ]
    order = data.draw(st.permutations(range(n)), label="order")
    rows = honest + evil
    items = [{"w": torch.tensor(rows[i], dtype=torch.float32)} for i in order]
    f = attackers if rule in ("krum", "multi-krum", "bulyan") else 0
    out = Aggregator(rule, f=f, beta=beta)(items, [1.0] * n)["w"]
    low = torch.tensor(honest, dtype=torch.float32).min(dim=0).values
    high = torch.tensor(honest, dtype=torch.float32).max(dim=0).values
    assert bool(((out >= low - 1e-4) & (out <= high + 1e-4)).all()), (out, low, high)
