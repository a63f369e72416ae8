"""Centralized ("DeepAll"): all source data pooled in one place."""

from __future__ import annotations

from fedshift.algorithms.fedavg import FedAvg


class Centralized(FedAvg):
    """The non-federated reference: one learner holds the union of all source domains.

    The engine pools every source client into a single client, so a "round" is E epochs
    of SGD over the pooled data; the same number of rounds, epochs, batch size and learning
    rate as the federated runs keeps the comparison fair. Nothing is communicated, so the
    reported bytes are zero.
    """

    name = "centralized"
    paper = "baseline (DeepAll: pooled source data, no federation)"
    pooled = True
    private = False  # no federation: nothing for client-level DP to protect
