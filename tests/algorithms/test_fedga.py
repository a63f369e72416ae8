"""FedGA: the GA weight update (both variants), rounds with adjusted aggregation weights on a
canned federation, and the validation error it measures."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import run_info

from fedshift.algorithms.fedga import FedGA, FedGAHparams, ga_update, validation_error
from fedshift.core.context import SplitView
from fedshift.core.errors import ConfigError
from fedshift.core.federation import Federation
from fedshift.core.record import Record
from fedshift.core.state import ServerState
from fedshift.data.domains import Split


def test_ga_update_paper_variant():
    new = ga_update(torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.4, 0.1, 0.1]), 0.2)
    torch.testing.assert_close(new, torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64))


def test_ga_update_official_variant():
    new = ga_update(
        torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.4, 0.1, 0.1]), 0.2, variant="official"
    )
    raw = torch.tensor([0.5 + 0.2 / 3, 0.3 + 0.2 / 12, 0.2 + 0.2 / 12], dtype=torch.float64)
    torch.testing.assert_close(new, raw / raw.sum())


def test_ga_update_clips_at_zero_and_renormalizes():
    new = ga_update(torch.tensor([0.05, 0.45, 0.5]), torch.tensor([0.0, 1.0, 2.0]), 0.2)
    torch.testing.assert_close(new, torch.tensor([0.0, 0.45, 0.7], dtype=torch.float64) / 1.15)


def test_ga_update_equal_gaps_keep_the_weights():
    new = ga_update(torch.tensor([0.6, 0.4]), torch.tensor([0.3, 0.3]), 0.2)
    torch.testing.assert_close(new, torch.tensor([0.6, 0.4], dtype=torch.float64))


class CannedFederation(Federation):
    """Replies with fixed models and gaps (round 1 without gaps)."""

    def __init__(self, models, gaps):
        self.models, self.gaps = models, gaps
        self.round, self.total_rounds = 1, 4

    def clients(self, role="source"):
        return [0, 1, 2]

    def sample(self, k=None, role="source"):
        return [0, 1, 2]

    def call(self, task, ids, record):
        replies = {}
        for cid in ids:
            reply = Record(arrays={"model.w": self.models[cid]}, metrics={"loss": 1.0})
            reply.metrics["num-examples"] = 10
            if self.round > 1:
                reply.arrays["gap"] = torch.tensor([self.gaps[cid]])
            replies[cid] = reply
        return replies


def test_fedga_rounds_aggregate_with_adjusted_weights():
    models = {0: torch.tensor([3.0]), 1: torch.tensor([6.0]), 2: torch.tensor([9.0])}
    fed = CannedFederation(models, gaps={0: 0.4, 1: 0.1, 2: 0.1})
    algo = FedGA(FedGAHparams(), run_info())
    state, metrics = algo.round(ServerState(model={"w": torch.zeros(1)}), fed)
    torch.testing.assert_close(state.model["w"], torch.tensor([6.0]))  # uniform 1/3
    assert "mean_gap" not in metrics
    fed.round = 2
    state, metrics = algo.round(state, fed)
    # t = 1, d_1 = (1 - 1/4)·0.2 = 0.15; spread [0.2, -0.1, -0.1] / 0.2
    weights = torch.tensor([1 / 3 + 0.15, 1 / 3 - 0.075, 1 / 3 - 0.075], dtype=torch.float64)
    torch.testing.assert_close(state.extra["ga_weights"], weights)
    expected = float((weights * torch.tensor([3.0, 6.0, 9.0], dtype=torch.float64)).sum())
    assert float(state.model["w"]) == pytest.approx(expected, rel=1e-6)
    assert metrics["mean_gap"] == pytest.approx(0.2)


def test_fedga_rejects_unknown_base_and_variant():
    with pytest.raises(ConfigError, match="base"):
        FedGA(FedGAHparams(base="scaffold"), run_info())
    with pytest.raises(ConfigError, match="variant"):
        FedGA(FedGAHparams(variant="other"), run_info())
    with pytest.raises(ConfigError, match="gap_metric"):
        FedGA(FedGAHparams(gap_metric="f1"), run_info())


def test_fedga_validation_error_is_loss_or_error_rate():
    """Logits equal to the input, uint8 255 / 0 -> 1 / -1: rows [1, -1], [-1, 1], [-1, 1]
    with labels 0, 0, 1, so two right with margin 2 and one wrong."""
    data = SplitView(
        Split(
            x=torch.tensor([[255, 0], [0, 255], [0, 255]], dtype=torch.uint8).reshape(3, 2, 1, 1),
            y=torch.tensor([0, 0, 1]),
        ),
        True,
        torch.device("cpu"),
    )
    model = torch.nn.Flatten()
    right, wrong = math.log(1 + math.exp(-2.0)), math.log(1 + math.exp(2.0))
    loss = validation_error(model, data, batch_size=2, metric="loss")
    assert loss == pytest.approx((2 * right + wrong) / 3)
    assert validation_error(model, data, batch_size=2, metric="accuracy") == pytest.approx(1 / 3)
