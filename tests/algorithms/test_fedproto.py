"""FedProto: the local prototype loss (exact numbers) and a short run on a synthetic
personalized task."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from helpers import CLASSES, NAN, run_info, run_personalized, t

from fedshift.algorithms._prototypes import (
    prototype_arrays,
    prototype_loss,
    prototypes_from_arrays,
)
from fedshift.algorithms.bd_fedproto import BDFedProto
from fedshift.algorithms.fedproto import FedProto, FedProtoHparams, only_classes, predict_nearest
from fedshift.core.federation import Federation
from fedshift.core.privacy import PrivacySettings, run_epsilon
from fedshift.core.record import Record
from fedshift.core.schema import schema_problem
from fedshift.core.seeding import torch_generator
from fedshift.models.base import FedModel


def test_fedproto_local_loss_is_the_official_mse():
    features = t([[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]])
    labels = torch.tensor([0, 1, 2])
    table = t([[0.0, 0.0], [3.0, 2.0], [NAN, NAN]])
    # squared errors 1+4 and 0+4; the class without a prototype counts as zero error
    assert float(prototype_loss(features, labels, table)) == pytest.approx(9.0 / 6.0)
    assert float(prototype_loss(features, labels, None)) == 0.0


def test_fedproto_run_reports_both_accuracies_and_carries_all_prototypes(tmp_path, synthetic):
    summary, history, exp = run_personalized(tmp_path, synthetic, "fedproto", "fp")
    assert summary["target"] == "clients"
    assert summary["personalized_accuracy"] == summary["target_accuracy_last"]
    last = history[-1]
    for key in ("proto_accuracy", "head_accuracy", "mi_mean", "proto_loss"):
        assert math.isfinite(last[key]), key
    assert {f"mi/{cid}" for cid in exp.contexts} <= set(last)
    assert last["proto_loss"] > 0 and history[0]["proto_loss"] == 0.0
    held = set()
    for ctx in exp.contexts.values():
        held |= set(torch.unique(ctx.train.y).tolist())
    for ctx in exp.contexts.values():
        table = ctx.state["prototypes"]
        assert set(torch.nonzero(~torch.isnan(table[:, 0])).flatten().tolist()) == held
    # nothing but prototypes and counts went up: far fewer bytes than a model
    assert summary["bytes_up"] < 3 * 2 * CLASSES * (256 * 4 + 8)


def _client_with_prototypes(inference: str):
    """A client whose features are its inputs, holding classes 1 and 2 of a 3-class table."""
    net = FedModel(torch.nn.Identity(), torch.nn.Linear(2, 3), embed_dim=2, num_classes=3)
    state = {
        "model": net.state_dict(),
        "prototypes": t([[0.0, 0.0], [1.0, 0.0], [5.0, 5.0]]),
        "classes": torch.tensor([1, 2]),
    }
    algo = FedProto(FedProtoHparams(inference=inference), run=None)
    return algo, algo.wrap_model(
        lambda: FedModel(torch.nn.Identity(), torch.nn.Linear(2, 3), embed_dim=2, num_classes=3),
        state,
    )


def test_fedproto_inference_rules_on_hand_made_prototypes():
    x = t([[0.1, 0.0], [0.9, 0.1], [4.0, 4.0]])
    # the paper's eq. 5 chooses among all global prototypes: class 0 is nearest to sample 0
    algo, model = _client_with_prototypes("all-prototypes")
    assert algo.predict(model, x).argmax(1).tolist() == [0, 1, 2]
    # the official rule chooses among the client's own classes (1, 2): sample 0 -> class 1
    algo, model = _client_with_prototypes("own-prototypes")
    scores = algo.predict(model, x)
    assert scores.argmax(1).tolist() == [1, 1, 2]
    assert torch.isinf(scores[:, 0]).all()  # class 0 is out of the rule
    assert scores[0, 1].item() == pytest.approx(-0.9)  # -‖(0.1, 0) − (1, 0)‖
    assert torch.equal(predict_nearest(model, x), scores)


def test_only_classes_blanks_the_other_rows():
    table = t([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    kept = only_classes(table, torch.tensor([2]))
    assert torch.isnan(kept[:2]).all() and torch.equal(kept[2], table[2])


def test_fedproto_refuses_prototypes_of_another_size():
    """The reply schema fixes the embedding size (16 in run_info()): the release's shape
    never depends on what a client sends."""
    schema = FedProto(FedProtoHparams(), run_info(0)).reply_schema("train", Record())
    count = torch.tensor(5)
    assert schema_problem({"prototype.0": torch.zeros(16), "count.0": count}, schema) is None
    problem = schema_problem({"prototype.0": torch.zeros(15), "count.0": count}, schema)
    assert problem is not None and "prototype.0" in problem


# -- the private release: the two neighbouring pairs --------------------------------

CLIP, NOISE, SAMPLED, DIM = 1.0, 1.0, 2, 16  # run_info(): 10 classes, embedding size 16


class PrototypeFederation(Federation):
    """Clients 0 and 1, both sampled, replying to ``train`` with fixed prototype sets; a
    client without a set sends nothing (its contribution zeroed)."""

    def __init__(self, sets: dict[int, dict[int, torch.Tensor]]):
        self.sets, self.round, self.total_rounds = sets, 1, 1

    def clients(self, role="source"):
        return [0, 1]

    def sample(self, k=None, role="source"):
        return [0, 1]

    def call(self, task, ids, record, fold=None):
        if task != "train":
            return {cid: Record() for cid in ids}
        replies = {}
        for cid in ids:
            if cid in self.sets:
                protos = self.sets[cid]
                metrics = {"num-examples": 10, "loss": 1.0, "ce-loss": 1.0, "proto-loss": 0.0}
                metrics.update({"mi": 0.5, "lambda-d": 1.0})
                arrays = prototype_arrays(protos, {c: 5 for c in protos})
                replies[cid] = Record(arrays=arrays, metrics=metrics)
        return replies


def private_release(algorithm, sets, noise=NOISE):
    """One round of ``algorithm`` with DP (C = 1) on the canned sets: the released table
    (float64) and the round metrics."""
    run = dataclasses.replace(run_info(0), privacy=PrivacySettings(CLIP, noise))
    algo = algorithm(algorithm.Hparams(), run)
    state, metrics = algo.round(algo.init_state(), PrototypeFederation(sets))
    return {int(c): p.double() for c, p in state.extra["prototypes"].items()}, metrics


def gaussian_pair_epsilon(distance: float, sigma: float, delta: float) -> float:
    """The exact ε at ``delta`` of two Gaussians N(μ, σ²I), N(μ', σ²I) with ‖μ − μ'‖ =
    ``distance`` (Balle & Wang 2018, Theorem 8), by bisection: the privacy loss of a
    neighbouring pair whose releases differ only in their mean."""

    def phi(x: float) -> float:
        return 0.5 * math.erfc(-x / math.sqrt(2))

    def delta_at(eps: float) -> float:
        a, b = distance / (2 * sigma), eps * sigma / distance
        return phi(a - b) - math.exp(eps) * phi(-a - b)

    low, high = 0.0, 100.0
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if delta_at(mid) > delta else (low, mid)
    return high


def unit(i: int, value: float) -> torch.Tensor:
    return value * torch.eye(DIM)[i]


A = torch.full((DIM,), 0.05)  # a class-0 prototype inside the clip ball (norm 0.2)
LONE_HOLDER = (  # client 1 alone holds class 9; its set (norm 5) is clipped to 1
    {0: {0: A}, 1: {0: unit(0, 3.0), 9: unit(1, 4.0)}},
    {0: {0: A}},
    {0: A / 2 + unit(0, 0.3), 9: unit(1, 0.4)},
    {0: A / 2},
)
DUPLICATE = ({0: {0: A}, 1: {0: A}}, {0: {0: A}}, {0: A}, {0: A / 2})  # same prototype twice


@pytest.mark.parametrize("algorithm", [FedProto, BDFedProto])
@pytest.mark.parametrize("pair", [LONE_HOLDER, DUPLICATE], ids=["lone-holder", "duplicate"])
def test_private_release_of_neighbours_is_bounded_by_the_reported_epsilon(algorithm, pair):
    """Issue 33's two neighbouring pairs (one client's contribution present or zeroed):
    (1) lone holder — client 1 alone holds class 9; (2) duplicate — client 1 sends the
    same class-0 prototype as client 0. Both neighbours release the same classes (all ten),
    with the same noise, N(0, (z·C/m)²) drawn from the round's seed whatever was sent; their
    noiseless means (exact, by hand) differ by at most C/m, m = 2 sampled clients. The
    pair's exact ε is then that of a Gaussian mechanism with multiplier ≥ z, below the ε
    the run reports for that round."""
    with_client, without_client, mean_with, mean_without = pair
    noisy, metrics = private_release(algorithm, with_client)
    noisy_neighbour, _ = private_release(algorithm, without_client)
    mean, _ = private_release(algorithm, with_client, noise=0.0)
    mean_neighbour, _ = private_release(algorithm, without_client, noise=0.0)
    assert sorted(noisy) == sorted(noisy_neighbour) == list(range(10))  # same support
    generator = torch_generator(0, "dp-noise", 1)
    for c in range(10):
        drawn = torch.randn(DIM, generator=generator, dtype=torch.float64) * NOISE * CLIP
        assert torch.allclose(noisy[c] - mean[c], drawn / SAMPLED, atol=1e-6)
        assert torch.allclose(noisy_neighbour[c] - mean_neighbour[c], drawn / SAMPLED, atol=1e-6)
        zero = torch.zeros(DIM, dtype=torch.float64)
        assert torch.allclose(mean[c], mean_with.get(c, zero).double(), atol=1e-7)
        assert torch.allclose(mean_neighbour[c], mean_without.get(c, zero).double(), atol=1e-7)
    distance = math.sqrt(sum(float((mean[c] - mean_neighbour[c]).square().sum()) for c in mean))
    assert distance <= CLIP / SAMPLED * (1 + 1e-6)
    reported = run_epsilon(PrivacySettings(CLIP, NOISE), rounds=1, sample_rate=1.0)
    exact = gaussian_pair_epsilon(distance, NOISE * CLIP / SAMPLED, 1e-5)
    assert exact <= reported
    assert not any(key.startswith("mi/") for key in metrics)  # per-client MI is not logged


def test_gaussian_pair_epsilon_matches_opacus_prv_accountant():
    """Sensitivity equal to σ (multiplier 1), one step without sampling, δ = 1e-5: the
    bisection gives 4.377; Opacus's PRV accountant (numerical, its own discretisation error)
    4.387; the RDP accountant fedshift reports, 4.73, bounds both."""
    from opacus.accountants import PRVAccountant

    prv = PRVAccountant()
    prv.step(noise_multiplier=1.0, sample_rate=1.0)
    with np.errstate(divide="ignore"):
        numerical = prv.get_epsilon(delta=1e-5)
    assert gaussian_pair_epsilon(1.0, 1.0, 1e-5) == pytest.approx(numerical, abs=0.02)
    assert gaussian_pair_epsilon(1.0, 1.0, 1e-5) == pytest.approx(4.377, abs=1e-3)


class _CountingBackbone(torch.nn.Module):
    """Features = inputs + the number of training-mode forwards so far (inputs in eval mode):
    shows which training batches a prototype was taken from."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        x = x.flatten(1)
        if not self.training:
            return x
        self.calls += 1
        return x + self.calls


@pytest.mark.parametrize(
    ("mode", "shift"),
    # 4 samples of class 0 in batches of 2, 2 local epochs: forwards 1, 2 then 3, 4
    [("after-training", 0.0), ("training-batches", 3.5)],
)
def test_local_prototypes_come_from_the_last_epochs_training_batches_or_an_eval_pass(mode, shift):
    from dataclasses import replace

    from helpers import client_context

    x = t([[1.0, 0.0], [3.0, 2.0], [5.0, 4.0], [7.0, 6.0]]).view(4, 2, 1, 1)
    ctx = client_context(x)
    ctx.build_model = lambda: FedModel(
        _CountingBackbone(), torch.nn.Linear(2, 3), embed_dim=2, num_classes=3
    )
    ctx.num_classes = 3
    ctx.train_cfg = replace(ctx.train_cfg, batch_size=2, local_epochs=2, lr=0.1)
    algo = FedProto(FedProtoHparams(local_prototypes=mode), run=run_info())
    reply = algo.train(ctx, Record())
    protos, counts = prototypes_from_arrays(reply.arrays)
    assert counts == {0: 4}
    # the class mean of the inputs, (4, 3) scaled to [-1, 1] as every image is; official:
    # plus mean(3, 3, 4, 4), the forwards of epoch 2 only
    mean = [4.0 / 127.5 - 1, 3.0 / 127.5 - 1]
    assert protos[0].tolist() == pytest.approx([m + shift for m in mean], abs=1e-6)
