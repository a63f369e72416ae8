"""FedProto and BD-FedProto: exact numbers of the prototype rules and losses, the DA update,
the MI diagnostic, and short runs on a synthetic personalized task (incl. model variants)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from fedshift.algorithms._prototypes import (
    aggregate_prototypes,
    class_prototypes,
    mutual_information,
    nearest_prototype_scores,
    prototype_loss,
)
from fedshift.algorithms.bd_fedproto import (
    BDFedProto,
    anneal_lambda,
    confidence,
    negative_loss,
)
from fedshift.config import make_hparams, resolve
from fedshift.core.context import SplitView
from fedshift.core.errors import ConfigError
from fedshift.data.domains import Domain, DomainDataset, Split
from fedshift.engine.assembly import prepare
from fedshift.engine.runner import Runner
from fedshift.models import FedModel
from fedshift.models.registry import parse_variants, variant_of_client

NAN = float("nan")


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


# -- prototype rules ---------------------------------------------------------------------------
def test_aggregate_prototypes_weighted_and_unweighted_with_missing_classes():
    protos = [{0: t([1.0, 0.0]), 1: t([2.0, 2.0])}, {0: t([3.0, 4.0])}]
    counts = [{0: 1, 1: 3}, {0: 3}]
    weighted = aggregate_prototypes(protos, counts, weighted=True)
    assert sorted(weighted) == [0, 1]
    assert torch.equal(weighted[0], t([2.5, 3.0]))  # (1*[1,0] + 3*[3,4]) / 4
    assert torch.equal(weighted[1], t([2.0, 2.0]))  # only client 0 holds class 1
    plain = aggregate_prototypes(protos, counts, weighted=False)
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


def test_fedproto_local_loss_is_the_official_mse():
    features = t([[1.0, 2.0], [3.0, 4.0], [0.0, 0.0]])
    labels = torch.tensor([0, 1, 2])
    table = t([[0.0, 0.0], [3.0, 2.0], [NAN, NAN]])
    # squared errors 1+4 and 0+4; the class without a prototype counts as zero error
    assert float(prototype_loss(features, labels, table)) == pytest.approx(9.0 / 6.0)
    assert float(prototype_loss(features, labels, None)) == 0.0


# -- BD-FedProto: CPA and DA ---------------------------------------------------------------------
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


def test_mutual_information_diagnostic():
    assert mutual_information(t([[1.0, 0.0], [0.0, 1.0]])) == pytest.approx(math.log(2))
    assert mutual_information(t([[0.7, 0.3], [0.7, 0.3]])) == pytest.approx(0.0, abs=1e-12)
    h_mean = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    expected = h_mean - math.log(2) / 2
    assert mutual_information(t([[0.5, 0.5], [1.0, 0.0]])) == pytest.approx(expected)


# -- short runs on a synthetic personalized task ------------------------------------------------
CLASSES = 4


def _split(per_class: int, seed: int) -> Split:
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(CLASSES).repeat_interleave(per_class)
    base = (y.view(-1, 1, 1, 1).float() * 60).expand(-1, 3, 8, 8)
    noise = torch.randint(0, 40, base.shape, generator=gen).float()
    return Split(x=(base + noise).clamp(0, 255).to(torch.uint8), y=y)


@pytest.fixture(scope="module")
def synthetic() -> DomainDataset:
    return DomainDataset(
        name="synth",
        domains={"a": Domain("a", _split(24, 0), _split(4, 1), _split(6, 2))},
        classes=[str(c) for c in range(CLASSES)],
        channels=3,
        image_size=8,
    )


def _run(tmp_path, synthetic, algorithm, name, **sets):
    settings = {
        "device": "cpu",
        "rounds": 2,
        "batch_size": 8,
        "partition": "nway-kshot",
        "clients_per_domain": 3,
        "ways": 2,
        "shots": 6,
        "stdev": 0,
        **sets,
    }
    cfg = resolve(
        None,
        {"algorithm": algorithm, "protocol": "personalized"},
        [f"{k}={v}" for k, v in settings.items()],
    )
    exp = prepare(cfg, dataset=synthetic)
    runner = Runner(exp, tmp_path / name, progress=False)
    summary = runner.run()
    history = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").open()]
    return summary, history, exp


def test_fedproto_run_reports_both_accuracies_and_carries_all_prototypes(tmp_path, synthetic):
    summary, history, exp = _run(tmp_path, synthetic, "fedproto", "fp")
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


def test_bd_fedproto_sends_own_classes_labeled_and_the_rest_unlabeled(tmp_path, synthetic):
    summary, history, exp = _run(tmp_path, synthetic, "bd-fedproto", "bd", rounds=3)
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


def test_fedavg_in_the_personalized_protocol_scores_the_global_model_per_client(
    tmp_path, synthetic
):
    summary, history, _ = _run(tmp_path, synthetic, "fedavg", "avg", rounds=1)
    assert history[-1]["target_accuracy"] == history[-1]["personalized_accuracy"]
    assert "personalized_accuracy_std" in summary


def test_heterogeneous_models_train_with_prototypes(tmp_path, synthetic):
    summary, _, exp = _run(
        tmp_path, synthetic, "fedproto", "het", rounds=1, hetero_models="width=0.5;width=1.0"
    )
    shapes = [ctx.state["model"]["backbone.conv1.weight"].shape[0] for ctx in exp.contexts.values()]
    assert shapes == [16, 16, 32]  # 3 clients, 2 variants: blocks of 2 and 1
    assert 0.0 <= summary["personalized_accuracy"] <= 1.0


def test_heterogeneous_models_need_an_algorithm_without_model_sharing(synthetic):
    cfg = resolve(
        None,
        {"algorithm": "fedavg", "protocol": "personalized"},
        ["device=cpu", "hetero_models=width=0.5;width=1.0"],
    )
    with pytest.raises(ConfigError, match="shares no model weights"):
        prepare(cfg, dataset=synthetic)


def test_variant_parsing_and_block_assignment():
    assert parse_variants("") == []
    assert parse_variants("fedproto")[0] == {"out_channels": (10, 18)}
    assert parse_variants("width=0.5,embed_dim=64;dropout=0.1") == [
        {"width": 0.5, "embed_dim": 64},
        {"dropout": 0.1},
    ]
    with pytest.raises(ValueError, match="key=value"):
        parse_variants("width")
    assert [variant_of_client(i, 20, 3) for i in (0, 6, 7, 13, 14, 19)] == [0, 0, 1, 1, 2, 2]


def test_hparams_reject_unknown_inference():
    cfg = resolve(None, {"algorithm": "fedproto"}, ["algo.inference=head"])
    assert make_hparams(cfg).inference == "head"
    with pytest.raises(ValueError, match="inference"):
        BDFedProto.Hparams(inference="knn")


def test_tsne_plot_rebuilds_the_run_and_marks_global_prototypes(tmp_path, synthetic, monkeypatch):
    from fedshift.engine import assembly
    from fedshift.report import tsne

    _run(tmp_path, synthetic, "fedproto", "plot", rounds=1)
    monkeypatch.setattr(assembly, "load_dataset", lambda *a, **k: synthetic)
    exp, state, round_ = tsne.load_run(tmp_path / "plot")
    embedding = tsne.collect(exp, state, per_client=5)
    assert round_ == 1 and embedding.prototypes_are_global
    assert embedding.features.shape == (15, 256) and len(embedding.client_names) == 3
    path = tsne.plot_tsne(tmp_path / "plot", tmp_path / "fig.png", per_client=5)
    assert path.stat().st_size > 1000
