"""FedProx's numbers: one round on a hand-made two-client problem equals a plain PyTorch loop
with the proximal term μ/2·‖w − θ‖² towards the received model."""

from __future__ import annotations

import torch
from two_clients import START, plain_sgd, run_one_round, sample_weighted_mean

from fedshift.algorithms.fedprox import FedProx


def test_one_round_is_the_sample_weighted_mean_of_proximal_sgd():
    mu = 2.0
    state, _ = run_one_round(FedProx, mu=mu)
    expected = sample_weighted_mean({0: plain_sgd(0, mu=mu), 1: plain_sgd(1, mu=mu)})
    plain = sample_weighted_mean({0: plain_sgd(0), 1: plain_sgd(1)})
    for key in START:
        torch.testing.assert_close(state.model[key], expected[key], atol=1e-6, rtol=0)
        # the term pulls from the second step on: the round differs from FedAvg's
        assert (state.model[key] - plain[key]).abs().max() > 1e-4


def test_mu_zero_is_fedavg():
    state, _ = run_one_round(FedProx, mu=0.0)
    expected = sample_weighted_mean({0: plain_sgd(0), 1: plain_sgd(1)})
    for key in START:
        torch.testing.assert_close(state.model[key], expected[key], atol=1e-6, rtol=0)
