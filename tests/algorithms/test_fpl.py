"""FPL: its losses, prototype clustering and aggregation on hand-made tensors."""

from __future__ import annotations

import math

import numpy as np
import torch
from helpers import close

from fedshift.algorithms.fpl import (
    accumulate_class_sums,
    aggregate_fpl,
    cluster_prototypes,
    cpcl_loss,
    finch_labels,
    upcr_loss,
)


def test_cpcl_exact():
    z = torch.tensor([[1.0, 0.0], [0.0, 3.0], [1.0, 1.0]])
    clusters = torch.tensor([[2.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    cluster_labels = torch.tensor([0, 0, 1])
    labels = torch.tensor([0, 1, 2])  # class 2 has no cluster
    loss = cpcl_loss(z, labels, clusters, cluster_labels, temperature=1.0)
    e = math.e
    assert close(loss[0], -math.log(2 * e / (2 * e + 1)))  # two positives (cos 1), one negative
    assert close(loss[1], -math.log(e / (e + 2)))  # one positive, two negatives (cos 0)
    assert close(loss[2], 0.0)


def test_upcr_exact():
    z = torch.tensor([[1.0, 2.0], [5.0, 5.0]])
    unbiased = torch.tensor([[0.0, 0.0], [float("nan"), float("nan")]])
    labels = torch.tensor([0, 1])
    assert close(upcr_loss(z, labels, unbiased, "sum"), [5.0, 0.0])  # paper: ‖z − U‖²
    assert close(upcr_loss(z, labels, unbiased, "mean"), [2.5, 0.0])  # official MSELoss


def test_fpl_aggregation_two_clusters():
    group_a = [[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [1.0, 0.05, 0.0]]
    group_b = [[0.0, 1.0, 0.0], [0.1, 0.9, 0.0], [0.0, 1.0, 0.05]]
    tables = [{0: torch.tensor(p), 1: torch.tensor(p) * 2} for p in group_a + group_b]
    tables[0][2] = torch.tensor([0.0, 0.0, 1.0])  # class 2: a single client prototype
    clusters, labels, unbiased = aggregate_fpl(tables, num_classes=4)
    mean_a, mean_b = np.mean(group_a, 0), np.mean(group_b, 0)
    assert labels.tolist() == [0, 0, 1, 1, 2]
    assert close(clusters[:2], [mean_a, mean_b])
    assert close(clusters[2:4], [2 * mean_a, 2 * mean_b])  # cosine: scale does not matter
    assert close(clusters[4], [0.0, 0.0, 1.0])
    assert close(unbiased[0], (mean_a + mean_b) / 2)
    assert close(unbiased[1], mean_a + mean_b)
    assert close(unbiased[2], [0.0, 0.0, 1.0])
    assert torch.isnan(unbiased[3]).all()  # nobody holds class 3


def test_fpl_class_sums_accumulate_over_batches():
    sums, counts = {}, {}
    accumulate_class_sums(
        sums, counts, torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([0, 1])
    )
    accumulate_class_sums(sums, counts, torch.tensor([[5.0, 6.0]]), torch.tensor([0]))
    assert counts == {0: 2, 1: 1}
    assert close(sums[0], [6.0, 8.0]) and close(sums[1], [3.0, 4.0])


def test_fpl_finch_partition_levels_and_small_classes():
    angles = np.deg2rad([0, 1, 10, 11, 80, 81, 89, 90])
    points = np.stack([np.cos(angles), np.sin(angles), np.zeros(8)], 1)
    assert finch_labels(points).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]  # coarsest (official)
    assert finch_labels(points, 0).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]  # finest
    pair = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    assert close(cluster_prototypes(pair), [[0.5, 0.5]])  # two prototypes: one cluster
    assert close(cluster_prototypes(pair[:1]), [[1.0, 0.0]])
