"""Prototype helpers shared by FedProto, BD-FedProto and others: aggregation, class means,
nearest-prototype scores and the mutual-information diagnostic (exact numbers)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import NAN, t
from torch import nn

from fedshift.algorithms._prototypes import (
    aggregate_prototypes,
    class_prototypes,
    mutual_information,
    nearest_prototype_scores,
)
from fedshift.core.context import SplitView
from fedshift.core.robust import Aggregator
from fedshift.data.domains import Split
from fedshift.models import FedModel


def test_aggregate_prototypes_weighted_and_unweighted_with_missing_classes():
    protos = [{0: t([1.0, 0.0]), 1: t([2.0, 2.0])}, {0: t([3.0, 4.0])}]
    counts = [{0: 1, 1: 3}, {0: 3}]
    weighted = aggregate_prototypes(protos, counts, weighted=True, aggregator=Aggregator())
    assert sorted(weighted) == [0, 1]
    assert torch.equal(weighted[0], t([2.5, 3.0]))  # (1*[1,0] + 3*[3,4]) / 4
    assert torch.equal(weighted[1], t([2.0, 2.0]))  # only client 0 holds class 1
    plain = aggregate_prototypes(protos, counts, weighted=False, aggregator=Aggregator())
    assert torch.equal(plain[0], t([2.0, 2.0]))
    assert torch.equal(plain[1], t([2.0, 2.0]))


def test_class_prototypes_are_per_class_feature_means_in_eval_mode():
    model = FedModel(nn.Flatten(), nn.Linear(1, 2), embed_dim=1, num_classes=2)
    model.train()
    x = torch.tensor([0, 255, 255, 255], dtype=torch.uint8).view(4, 1, 1, 1)  # -> -1, 1, 1, 1
    data = SplitView(Split(x=x, y=torch.tensor([0, 0, 1, 1])), True, torch.device("cpu"))
    protos, counts = class_prototypes(model, data, torch.device("cpu"), batch_size=3)
    assert counts == {0: 2, 1: 2}
    assert torch.equal(protos[0], t([0.0])) and torch.equal(protos[1], t([1.0]))
    assert model.training, "the previous mode is restored"


def test_nearest_prototype_scores_skip_missing_classes():
    table = t([[0.0, 0.0], [NAN, NAN], [3.0, 4.0]])
    scores = nearest_prototype_scores(t([[0.0, 1.0]]), table)
    assert scores[0, 0] == -1.0
    assert scores[0, 1] == float("-inf")
    assert math.isclose(float(scores[0, 2]), -math.sqrt(18.0), rel_tol=1e-6)
    assert int(scores.argmax(1)) == 0


def test_mutual_information_diagnostic():
    assert mutual_information(t([[1.0, 0.0], [0.0, 1.0]])) == pytest.approx(math.log(2))
    assert mutual_information(t([[0.7, 0.3], [0.7, 0.3]])) == pytest.approx(0.0, abs=1e-12)
    h_mean = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    expected = h_mean - math.log(2) / 2
    assert mutual_information(t([[0.5, 0.5], [1.0, 0.0]])) == pytest.approx(expected)
