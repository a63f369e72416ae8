"""Unsupervised federated domain adaptation: the msst protocol, FACT / FACT-NF and FADA."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from fedshift.algorithms.fact import (
    FACT,
    TwoHeadModel,
    aggregate_generators,
    average_heads,
    inter_domain_distance,
    scheduled_lr,
    split_generator_head,
)
from fedshift.algorithms.fact_nf import FACTNoFinetune
from fedshift.algorithms.fada import (
    attention_weights,
    log_dispersion,
    mine_lower_bound,
    negative_entropy,
)
from fedshift.config import resolve
from fedshift.core.context import LabelAccessError
from fedshift.core.errors import ConfigError
from fedshift.core.federation import Federation
from fedshift.core.record import Record
from fedshift.core.state import ServerState
from fedshift.engine.assembly import prepare
from fedshift.engine.protocol_msst import NO_LABEL
from fedshift.engine.runner import Runner
from fedshift.engine.scenario import pool_clients
from fedshift.engine.selection import score_selection
from fedshift.models.base import FedModel


def msst_cfg(algorithm: str = "fact", **overrides):
    settings = {"rounds": 2, "batch_size": 32, "device": "cpu", **overrides}
    flags = {"algorithm": algorithm, "target": "optdigits", "protocol": "msst"}
    return resolve(None, flags, [f"{k}={v}" for k, v in settings.items()])


# -- FACT: exact numbers on hand-made tensors ---------------------------------------------
def test_idd_is_mean_absolute_softmax_difference():
    log3 = math.log(3.0)
    first = torch.tensor([[0.0, 0.0], [log3, 0.0]])  # softmax: [.5, .5], [.75, .25]
    second = torch.tensor([[log3, 0.0], [0.0, 0.0]])  # softmax: [.75, .25], [.5, .5]
    assert inter_domain_distance(first, second).item() == pytest.approx(0.25, abs=1e-7)
    assert inter_domain_distance(first, first).item() == 0.0


def test_official_learning_rate_schedule():
    assert scheduled_lr(0.005, 0, 10, 0.75) == 0.005
    assert scheduled_lr(0.005, 5, 10, 0.75) == pytest.approx(0.005 * 6.0**-0.75, rel=1e-12)
    assert scheduled_lr(0.005, 10, 10, 0.75) == pytest.approx(0.005 * 11.0**-0.75, rel=1e-12)


def test_generator_and_head_aggregation():
    g1 = {
        "backbone.w": torch.tensor([1.0, 2.0]),
        "backbone.bn.num_batches_tracked": torch.tensor(2),
    }
    g2 = {
        "backbone.w": torch.tensor([3.0, 6.0]),
        "backbone.bn.num_batches_tracked": torch.tensor(5),
    }
    mean = aggregate_generators([g1, g2])
    assert torch.equal(mean["backbone.w"], torch.tensor([2.0, 4.0]))
    assert mean["backbone.bn.num_batches_tracked"].item() == 4  # round(3.5), int dtype kept
    h1 = {"head.weight": torch.tensor([[1.0, 0.0]]), "head.bias": torch.tensor([1.0])}
    h2 = {"head.weight": torch.tensor([[0.0, 1.0]]), "head.bias": torch.tensor([3.0])}
    head = average_heads([h1, h2])
    assert torch.equal(head["head.weight"], torch.tensor([[0.5, 0.5]]))
    assert torch.equal(head["head.bias"], torch.tensor([2.0]))
    generator, only_head = split_generator_head({**g1, **h1})
    assert set(generator) == set(g1) and set(only_head) == set(h1)
    with pytest.raises(ValueError, match="backbone/head"):
        split_generator_head({"disentangler.w": torch.zeros(1)})


def test_two_head_model_takes_the_more_confident_head():
    model = FedModel(nn.Identity(), nn.Linear(2, 2, bias=False), embed_dim=2, num_classes=2)
    second = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        model.head.weight.copy_(torch.eye(2))  # F1(x) = x
        second.weight.copy_(torch.tensor([[0.0, 3.0], [0.0, 0.0]]))  # F2(x) = [3·x2, 0]
    out = TwoHeadModel(model, second)(torch.tensor([[4.0, 1.0], [0.0, 2.0]]))
    # sample 0: F1 = [4, 1] (max 4) beats F2 = [3, 0]; sample 1: F2 = [6, 0] beats F1 = [0, 2]
    assert torch.equal(out, torch.tensor([[4.0, 1.0], [6.0, 0.0]]))


class ScriptedFederation(Federation):
    """Three sources (0, 1, 2) and a target (3); replies are hand-made, calls are recorded."""

    def __init__(self, replies: dict[str, dict[int, Record]]):
        self.replies = replies
        self.calls: list[tuple[str, list[int], Record]] = []

    def clients(self, role="source"):
        return {"source": [0, 1, 2], "target": [3]}[role]

    def sample(self, k=None, role="source"):
        return [0, 2]

    def call(self, task, ids, record):
        self.calls.append((task, list(ids), record))
        return {cid: self.replies[task][cid] for cid in ids}


def _model_reply(prefix_tensors: dict[str, float], **metrics) -> Record:
    arrays = {f"model.{k}": torch.tensor([v]) for k, v in prefix_tensors.items()}
    return Record(arrays=arrays, metrics={"num-examples": 10, **metrics})


def _fact(cls=FACT) -> FACT:
    return cls(cls.Hparams(), run=None)


def test_fact_round_aggregates_as_the_paper_says():
    fed = ScriptedFederation(
        {
            "train": {
                0: _model_reply({"backbone.w": 1.0}, loss=1.0),
                2: _model_reply({"backbone.w": 3.0}, loss=3.0),
            },
            "finetune": {
                0: _model_reply({"head.b": 10.0}, loss=0.5),
                2: _model_reply({"head.b": 20.0}, loss=0.5),
            },
            "idd": {3: _model_reply({"backbone.w": 7.0}, idd=0.125)},
        }
    )
    state = ServerState(model={"backbone.w": torch.tensor([0.0]), "head.b": torch.tensor([0.0])})
    state, metrics = _fact().round(state, fed)
    assert [c[0] for c in fed.calls] == ["train", "finetune", "idd"]
    assert fed.calls[0][2].config["send_head"] is False
    # the fine-tuning step ships the aggregated generator G' = (1 + 3) / 2 and nothing else
    assert set(fed.calls[1][2].arrays) == {"model.backbone.w"}
    assert fed.calls[1][2].arrays["model.backbone.w"].item() == 2.0
    # the target gets G' and both fine-tuned heads
    sent = fed.calls[2][2].arrays
    assert sent["model.backbone.w"].item() == 2.0
    assert sent["heads.0.head.b"].item() == 10.0 and sent["heads.1.head.b"].item() == 20.0
    # new global: G = G_t, F = mean of the fine-tuned heads
    assert state.model["backbone.w"].item() == 7.0
    assert state.model["head.b"].item() == 15.0
    assert metrics["selection_score"] == metrics["idd"] == 0.125
    assert metrics["train_loss"] == 2.0


def test_fact_nf_skips_finetuning_and_averages_trained_heads():
    fed = ScriptedFederation(
        {
            "train": {
                0: _model_reply({"backbone.w": 1.0, "head.b": 4.0}, loss=1.0),
                2: _model_reply({"backbone.w": 5.0, "head.b": 8.0}, loss=1.0),
            },
            "idd": {3: _model_reply({"backbone.w": -1.0}, idd=0.5)},
        }
    )
    state = ServerState(model={"backbone.w": torch.tensor([0.0]), "head.b": torch.tensor([0.0])})
    state, _ = _fact(FACTNoFinetune).round(state, fed)
    assert [c[0] for c in fed.calls] == ["train", "idd"]
    assert fed.calls[0][2].config["send_head"] is True
    assert fed.calls[1][2].arrays["model.backbone.w"].item() == 3.0
    assert state.model["backbone.w"].item() == -1.0 and state.model["head.b"].item() == 6.0


def test_fact_without_target_step_keeps_the_source_average():
    fed = ScriptedFederation(
        {
            "train": {
                0: _model_reply({"backbone.w": 1.0, "head.b": 4.0}, loss=1.0),
                2: _model_reply({"backbone.w": 5.0, "head.b": 8.0}, loss=1.0),
            }
        }
    )
    state = ServerState(model={"backbone.w": torch.tensor([0.0]), "head.b": torch.tensor([0.0])})
    algo = FACTNoFinetune(FACTNoFinetune.Hparams(adapt_target=False), run=None)
    state, metrics = algo.round(state, fed)
    assert [c[0] for c in fed.calls] == ["train"]
    assert state.model["backbone.w"].item() == 3.0 and state.model["head.b"].item() == 6.0
    assert "selection_score" not in metrics


# -- FADA: exact numbers ------------------------------------------------------------------
def test_fada_losses_and_attention():
    assert negative_entropy(torch.zeros(3, 4)).item() == pytest.approx(-math.log(4.0))
    statistics = nn.Linear(2, 1)
    with torch.no_grad():
        statistics.weight.copy_(torch.tensor([[1.0, 0.0]]))  # T(p, q) = p
        statistics.bias.zero_()
    p, q = torch.tensor([[1.0], [2.0]]), torch.tensor([[0.0], [5.0]])
    bound = mine_lower_bound(statistics, p, q, torch.tensor([1, 0]))
    expected = 1.5 - (math.log(math.e + math.e**2) - math.log(2.0))
    assert bound.item() == pytest.approx(expected, rel=1e-6)
    assert attention_weights([0.0, math.log(3.0)]) == pytest.approx([0.25, 0.75])
    x = torch.tensor([[0.0], [2.0], [10.0], [12.0]])
    assert log_dispersion(x, 2, 10, torch.Generator().manual_seed(0)) == pytest.approx(
        math.log(4.0)
    )


# -- the msst protocol and label safety ---------------------------------------------------
def test_msst_clients_and_label_safety(tiny_digits):
    exp = prepare(msst_cfg("fact", clients_per_domain=2), dataset=tiny_digits)
    sources = [d for d in tiny_digits.domain_names if d != "optdigits"]
    assert exp.scenario.sources == sources and exp.scenario.targets == ["optdigits"]
    roles = [(c.domain, c.role) for c in exp.scenario.clients]
    assert roles == [(d, "source") for d in sources for _ in range(2)] + [("optdigits", "target")]
    target = exp.scenario.clients[-1]
    ctx = exp.contexts[target.client_id]
    assert ctx.role == "target" and not ctx.labeled
    for view in (ctx.train, ctx.val, ctx.test):
        with pytest.raises(LabelAccessError):
            _ = view.y
        with pytest.raises(LabelAccessError):
            _ = view.mask
        with pytest.raises(LabelAccessError):
            next(view.batches(8))
        # even the private split holds no real label
        assert bool((view._split.y == NO_LABEL).all()) and view._split.mask is None
    real = tiny_digits.domain("optdigits").train
    assert len(ctx.train) == len(real) and torch.equal(ctx.train.x, real.x)
    x, y = next(ctx.train.batches(8, labels=False, shuffle=False))
    assert y is None and x.shape[0] == 8
    source_ctx = exp.contexts[0]
    assert source_ctx.labeled and int(source_ctx.train.y.min()) >= 0


def test_msst_sources_only_for_fedavg_and_centralized(tmp_path, tiny_digits):
    exp = prepare(msst_cfg("fedavg"), dataset=tiny_digits)
    runner = Runner(exp, tmp_path, progress=False)
    target_id = exp.scenario.clients[-1].client_id
    assert target_id not in runner.fed.sample() and runner.fed.clients("target") == [target_id]
    pooled = pool_clients(exp.scenario.clients, "+".join(exp.scenario.sources))
    assert len(pooled.train) == sum(
        len(c.train) for c in exp.scenario.clients if c.role == "source"
    )
    central = prepare(msst_cfg("centralized"), dataset=tiny_digits)
    assert [c.role for c in central.scenario.clients] == ["source"]


def test_protocol_support_is_checked():
    for algorithm in ("fact", "fact-nf", "fada"):
        with pytest.raises(ConfigError, match="supported: msst"):
            resolve(None, {"algorithm": algorithm, "protocol": "lodo"}, [])
    assert resolve(None, {"algorithm": "fedavg", "protocol": "msst"}, []).protocol == "msst"


# -- min-IDD model selection --------------------------------------------------------------
def test_score_selection_picks_the_lowest_first():
    history = [
        {"round": 1, "target_accuracy": 0.1, "selection_score": 0.3},
        {"round": 2, "target_accuracy": 0.5, "selection_score": 0.1},
        {"round": 3, "target_accuracy": 0.7, "selection_score": 0.1},
        {"round": 4, "target_accuracy": 0.9},
    ]
    assert score_selection("min_idd").pick(history)["round"] == 2
    assert score_selection("max", lower_is_better=False).pick(history)["round"] == 1
    assert score_selection("min_idd").pick([{"round": 1, "target_accuracy": 0.2}]) is None


def test_fact_nf_run_reports_min_idd_selection(tmp_path, tiny_digits):
    exp = prepare(msst_cfg("fact-nf", rounds=3), dataset=tiny_digits)
    summary = Runner(exp, tmp_path / "run", progress=False).run()
    history = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    best = min(history, key=lambda h: h["selection_score"])
    assert summary["min_idd_round"] == best["round"]
    assert summary["target_accuracy_min_idd"] == best["target_accuracy"]
    assert summary["bytes_up"] > 0 and summary["bytes_down"] > summary["bytes_up"]
