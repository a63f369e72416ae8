"""FedProto: the local prototype loss (exact numbers) and a short run on a synthetic
personalized task."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import CLASSES, NAN, run_personalized, t

from fedshift.algorithms._prototypes import prototype_loss
from fedshift.algorithms.fedproto import FedProto, FedProtoHparams, only_classes, predict_nearest
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
