"""FedAvg's numbers: one round on a hand-made two-client problem equals a plain PyTorch loop,
whose first step is checked against the closed-form gradient of cross-entropy."""

from __future__ import annotations

import torch
from two_clients import START, TRAIN, model_inputs, plain_sgd, run_one_round, sample_weighted_mean

from fedshift.algorithms.fedavg import FedAvg


def test_one_round_is_the_sample_weighted_mean_of_plain_sgd():
    state, _ = run_one_round(FedAvg)
    expected = sample_weighted_mean({0: plain_sgd(0), 1: plain_sgd(1)})
    assert set(state.model) == set(START)
    for key in START:
        torch.testing.assert_close(state.model[key], expected[key], atol=1e-6, rtol=0)
        assert not torch.allclose(state.model[key], START[key])  # the round moved the model


def test_the_plain_loop_takes_the_closed_form_step():
    # one step of client 1: the gradient of mean CE is (softmax(z) − onehot(y))ᵀ x / n
    x, y = model_inputs(1)
    z = x @ START["1.weight"].T + START["1.bias"]
    residual = torch.softmax(z, dim=1) - torch.nn.functional.one_hot(y, 2).float()
    grad_w, grad_b = residual.T @ x / len(y), residual.mean(dim=0)
    lr, wd = TRAIN.lr, TRAIN.weight_decay
    step = plain_sgd(1, epochs=1)
    torch.testing.assert_close(
        step["1.weight"], START["1.weight"] - lr * (grad_w + wd * START["1.weight"])
    )
    torch.testing.assert_close(
        step["1.bias"], START["1.bias"] - lr * (grad_b + wd * START["1.bias"])
    )
