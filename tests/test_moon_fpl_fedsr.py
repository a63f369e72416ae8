"""MOON, FPL and FedSR: their losses and aggregation on hand-made tensors, and the per-domain
protocol (FPL's setting)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from conftest import shrink

from fedshift.algorithms.fedsr import FedSR, cmi_penalty, gaussian_kl, l2r_penalty
from fedshift.algorithms.fpl import (
    accumulate_class_sums,
    aggregate_fpl,
    cluster_prototypes,
    cpcl_loss,
    finch_labels,
    upcr_loss,
)
from fedshift.algorithms.moon import Moon, MoonNet, model_contrastive_loss
from fedshift.config import resolve
from fedshift.core.errors import ConfigError
from fedshift.engine.assembly import prepare
from fedshift.engine.protocols import build_scenario
from fedshift.engine.runner import Runner


def close(actual, expected, tol=1e-6) -> bool:
    """``actual`` (a tensor or number) equals ``expected`` (numbers, lists, arrays) within tol."""
    actual = torch.as_tensor(actual).detach().to(torch.float64)
    expected = torch.from_numpy(np.asarray(expected, dtype=np.float64))
    return actual.shape == expected.shape and torch.allclose(actual, expected, atol=tol)


# -- MOON -------------------------------------------------------------------------------------
def test_moon_loss_exact():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    z_glob = torch.tensor([[3.0, 0.0], [0.0, 1.0]])  # cosine 1 with z
    z_prev = torch.tensor([[0.0, 1.0], [1.0, 1.0]])  # cosine 0 and 1/sqrt(2)
    loss = model_contrastive_loss(z, z_glob, z_prev, temperature=0.5)
    first = math.log1p(math.exp(-2.0))  # logits (2, 0)
    second = math.log1p(math.exp(2.0 / math.sqrt(2) - 2.0))  # logits (2, sqrt 2)
    assert close(loss, (first + second) / 2)
    # a client's first round: no previous model, only the positive pair -> log(1) = 0
    assert close(model_contrastive_loss(z, z_glob, None, 0.5), 0.0)


def test_moon_net_projection_and_head():
    from fedshift.models import build_model

    base = build_model("cnn", 10, in_channels=3, image_size=32, embed_dim=64)
    net = MoonNet(base, proj_dim=16, classify_projection=True)
    z, logits = net.represent(torch.zeros(3, 3, 32, 32))
    assert z.shape == (3, 16) and logits.shape == (3, 10)
    assert net.head.in_features == 16 and torch.equal(net.features(torch.zeros(3, 3, 32, 32)), z)
    base = build_model("cnn", 10, in_channels=3, image_size=32, embed_dim=64)
    on_features = MoonNet(base, proj_dim=16, classify_projection=False)
    assert on_features.head.in_features == 64
    assert on_features.represent(torch.zeros(2, 3, 32, 32))[0].shape == (2, 16)


# -- FedSR ------------------------------------------------------------------------------------
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


# -- FPL --------------------------------------------------------------------------------------
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


# -- per-domain protocol ----------------------------------------------------------------------
def test_per_domain_clients_and_targets(digits):
    cfg = resolve(None, {"protocol": "per-domain"}, ["clients_per_domain=2"])
    assert cfg.target == "all"
    task = build_scenario(cfg, digits, pooled=False)
    assert task.targets == task.sources == digits.domain_names
    assert [c.domain for c in task.clients] == [d for d in digits.domain_names for _ in (0, 1)]
    for name in digits.domain_names:
        mine = [c for c in task.clients if c.domain == name]
        assert sum(len(c.train) for c in mine) == len(digits.domain(name).train)
        assert all(c.role == "source" for c in mine)

    subset = resolve(None, {"protocol": "per-domain", "sources": "mnist,syn"}, [])
    assert build_scenario(subset, digits, pooled=False).targets == ["mnist", "syn"]
    with pytest.raises(ConfigError, match="--target all"):
        build_scenario(
            resolve(None, {"protocol": "per-domain", "target": "mnist"}, []), digits, pooled=False
        )
    with pytest.raises(ConfigError, match="unknown domain"):
        build_scenario(
            resolve(None, {"protocol": "per-domain", "sources": "usps"}, []), digits, pooled=False
        )


def test_client_data_fraction(digits):
    settings = ["clients_per_domain=2", "client_data_fraction=0.05"]
    cfg = resolve(None, {"protocol": "per-domain"}, settings)
    full = build_scenario(
        resolve(None, {"protocol": "per-domain"}, settings[:1]), digits, pooled=False
    )
    small = build_scenario(cfg, digits, pooled=False)
    again = build_scenario(cfg, digits, pooled=False)
    for whole, part, same in zip(full.clients, small.clients, again.clients, strict=True):
        assert len(part.train) == round(0.05 * len(whole.train))
        assert len(part.val) == len(whole.val) and len(part.test) == len(whole.test)
        assert torch.equal(part.train.y, same.train.y) and torch.equal(part.train.x, same.train.x)
    with pytest.raises(ConfigError, match="client_data_fraction"):
        resolve(None, {}, ["client_data_fraction=0"])


@pytest.fixture(scope="module")
def micro_digits(digits):
    return shrink(digits, train=48, val=16, test=16)


def test_per_domain_run_reports_mean_over_domains(tmp_path, micro_digits):
    cfg = resolve(
        None,
        {"algorithm": "fpl", "protocol": "per-domain"},
        ["rounds=2", "device=cpu", "batch_size=16"],
    )
    summary = Runner(prepare(cfg, dataset=micro_digits), tmp_path / "run", progress=False).run()
    assert summary["target"] == "all" and summary["protocol"] == "per-domain"
    per_domain = summary["per_domain_accuracy"]
    assert set(per_domain) == set(micro_digits.domain_names)
    assert close(summary["target_accuracy"], sum(per_domain.values()) / len(per_domain), 1e-12)
    history = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert history[0]["prototype_loss"] == 0.0 and history[1]["prototype_loss"] > 0.0


# -- options ---------------------------------------------------------------------------------
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


def test_bad_hyperparameters_are_config_errors(micro_digits):
    for algorithm, setting in (
        ("fedsr", "algo.l2r=cube"),
        ("fpl", "algo.upcr_reduction=max"),
        ("fpl", "algo.prototype_pass=test"),
        ("moon", "algo.temperature=0"),
    ):
        cfg = resolve(
            None, {"algorithm": algorithm, "target": "optdigits"}, [setting, "device=cpu"]
        )
        with pytest.raises(ConfigError):
            prepare(cfg, dataset=micro_digits)
    assert Moon.Hparams().mu == 1.0 and Moon.Hparams().temperature == 0.5
