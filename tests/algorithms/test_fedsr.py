"""FedSR: the L2R and CMI penalties (exact numbers) and a run with a shared reference
distribution and seeded test-time sampling."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import close

from fedshift.algorithms.fedsr import FedSR, cmi_penalty, gaussian_kl, l2r_penalty
from fedshift.config import resolve
from fedshift.engine.assembly import prepare
from fedshift.engine.run.runner import Runner


def test_fedsr_l2r_exact():
    z = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    assert close(l2r_penalty(z, "squared"), 12.5)  # mean ‖z‖² (paper)
    assert close(l2r_penalty(z, "norm"), 2.5)  # mean ‖z‖ (official code)
    with pytest.raises(ValueError, match="squared"):
        l2r_penalty(z, "cube")


def test_gaussian_kl_exact():
    mu, sigma = torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 2.0]])
    ref_mu, ref_sigma = torch.zeros(1, 2), torch.ones(1, 2)
    # dim 1: 0 + (1 + 1)/2 - 1/2 = 0.5; dim 2: log(1/2) + 4/2 - 1/2 = 1.5 - ln 2
    assert close(gaussian_kl(mu, sigma, ref_mu, ref_sigma), [0.5 + 1.5 - math.log(2)])
    assert close(gaussian_kl(mu, torch.ones(1, 2), mu, torch.ones(1, 2)), [0.0])
    # agrees with torch.distributions
    dist = torch.distributions
    p = dist.Independent(dist.Normal(mu, sigma), 1)
    q = dist.Independent(dist.Normal(ref_mu + 0.3, ref_sigma * 1.7), 1)
    expected = dist.kl_divergence(p, q)
    assert close(gaussian_kl(mu, sigma, ref_mu + 0.3, ref_sigma * 1.7), expected.tolist(), 1e-5)


def test_cmi_penalty_indexes_reference_by_label():
    one = math.log(math.e - 1.0)  # softplus(one) == 1
    ref_mu = torch.tensor([[0.0], [2.0]])
    ref_sigma_raw = torch.full((2, 1), one)
    mu, sigma = torch.tensor([[0.0], [0.0]]), torch.tensor([[1.0], [1.0]])
    labels = torch.tensor([0, 1])
    # sample 0 matches r(z|0): KL 0; sample 1 is 2 away from r_mu[1]: KL (0 + 4)/2 = 2
    assert close(cmi_penalty(mu, sigma, labels, ref_mu, ref_sigma_raw), 1.0)
    # the official code's scale C multiplies mu and sigma: sigma 2 vs r_sigma 1 -> 1.5 - ln 2
    scaled = cmi_penalty(mu, sigma, torch.tensor([0, 0]), ref_mu, ref_sigma_raw, torch.tensor(2.0))
    assert close(scaled, 1.5 - math.log(2))


def test_fedsr_shared_reference_and_prediction(tmp_path, micro_digits):
    cfg = resolve(
        None,
        {"algorithm": "fedsr", "target": "optdigits"},
        ["rounds=2", "device=cpu", "batch_size=16", "algo.share_reference=true", "algo.z_dim=8"],
    )
    exp = prepare(cfg, dataset=micro_digits)
    runner = Runner(exp, tmp_path / "run", progress=False)
    runner.run()
    assert runner.fed.seen_shares == {"model", "reference"}
    assert "reference" not in FedSR.shares  # the class manifest keeps the official default
    algo = exp.algorithm
    reference = runner.fed.algorithm.shares
    assert reference["reference"] == "prototype"
    for ctx in exp.contexts.values():
        assert ctx.state["r_mu"].shape == (10, 8)
    model = algo.global_model(_final_state(tmp_path / "run")).eval()
    x = torch.zeros(4, 3, 32, 32)
    first, second = algo.predict(model, x), algo.predict(model, x)
    assert torch.equal(first, second)  # seeded test-time sampling
    assert close(first.exp().sum(1), [1.0] * 4, 1e-5)  # log of averaged softmax


def _final_state(run_dir):
    from fedshift.core.state import ServerState, load_checkpoint

    return ServerState.from_dict(load_checkpoint(run_dir / "checkpoint.pt")["server"])
