"""BD-FedProto: the CPA negative loss and the DA update (exact numbers), and a short run on a
synthetic personalized task."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from helpers import NAN, run_personalized, t

from fedshift.algorithms.bd_fedproto import BDFedProto, anneal_lambda, confidence, negative_loss


def test_cpa_negative_loss_uses_other_classes_and_unlabeled_prototypes():
    features = t([[0.0, 0.0]])
    labels = torch.tensor([0])
    table = t([[0.0, 0.0], [1.0, 1.0], [NAN, NAN]])  # own classes 0 and 1
    negatives = t([[2.0, 0.0]])  # a class the client lacks, label stripped
    # class 0 is the sample's own class: excluded; d = mean squared difference
    expected = (math.exp(-1.0) + math.exp(-2.0)) / 2
    assert float(negative_loss(features, labels, table, negatives)) == pytest.approx(expected)
    assert float(negative_loss(features, labels, None, None)) == 0.0
    far = float(negative_loss(features, labels, None, t([[100.0, 100.0]])))
    assert 0.0 <= far < 1e-12, "bounded and vanishing for distant negatives"


def test_da_confidence_and_annealed_step():
    assert confidence(ce=0.5, ce_prev=1.0, proto=1.0, proto_prev=1.0) == 2.0
    assert confidence(ce=1.0, ce_prev=1.0, proto=0.8, proto_prev=1.0) == pytest.approx(0.8)
    assert confidence(ce=1.0, ce_prev=1.0, proto=0.1, proto_prev=1.0) == 0.5  # clipped
    assert anneal_lambda(1.0, 2.0, 1, 1.0, 0.1, 2.0) == pytest.approx(1.0 + math.exp(-1.0))
    assert anneal_lambda(1.0, 0.5, 1, 1.0, 0.1, 2.0) == pytest.approx(1.0 - 0.5 * math.exp(-0.5))
    late = anneal_lambda(1.0, 2.0, 10, 1.0, 0.1, 2.0)
    assert late - 1.0 == pytest.approx(math.exp(-10.0)), "a cooled temperature freezes λ_D"


def _da_run(ce_losses, proto_losses, **hp):
    algo = BDFedProto(BDFedProto.Hparams(**hp), run=None)
    ctx = SimpleNamespace(state={"prototypes": t([[0.0]])}, round=0)
    lambdas = []
    for round_, (ce, proto) in enumerate(zip(ce_losses, proto_losses, strict=True), start=1):
        ctx.round = round_
        lambdas.append(algo.after_training(ctx, {"ce-loss": ce, "proto-loss": proto})["lambda-d"])
    return lambdas


def test_da_raises_lambda_when_local_loss_falls_faster_and_lowers_it_otherwise():
    flat = [1.0] * 6
    falling = [1.0, 0.7, 0.5, 0.35, 0.25, 0.18]
    up = _da_run(falling, flat, temperature=5.0)
    down = _da_run(flat, falling, temperature=5.0)
    assert up[0] == 1.0 and down[0] == 1.0, "no previous round: λ_D stays at its start"
    assert all(b > a for a, b in zip(up, up[1:], strict=False))
    assert all(b < a for a, b in zip(down, down[1:], strict=False))
    assert max(up) <= 2.0 and min(down) >= 0.1
    hot, cold = _da_run(falling, flat, temperature=5.0), _da_run(falling, flat, temperature=0.2)
    assert hot[-1] > cold[-1] > 1.0, "a lower temperature damps the adjustment"


def test_bd_fedproto_sends_own_classes_labeled_and_the_rest_unlabeled(tmp_path, synthetic):
    summary, history, exp = run_personalized(tmp_path, synthetic, "bd-fedproto", "bd", rounds=3)
    assert math.isfinite(history[-1]["lambda_d"])
    held = set()
    for ctx in exp.contexts.values():
        held |= set(torch.unique(ctx.train.y).tolist())
    for ctx in exp.contexts.values():
        own = set(torch.unique(ctx.train.y).tolist())
        table = ctx.state["prototypes"]
        assert set(torch.nonzero(~torch.isnan(table[:, 0])).flatten().tolist()) == own
        assert len(ctx.state.get("negatives", [])) == len(held - own)
        assert 0.1 <= ctx.state["lambda_d"] <= 2.0
    assert 0.0 <= summary["personalized_accuracy"] <= 1.0
