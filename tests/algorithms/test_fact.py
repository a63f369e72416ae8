"""FACT and FACT-NF: exact numbers on hand-made tensors, rounds on a scripted federation,
and a run reporting min-IDD model selection."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import msst_cfg, read_history
from torch import nn

from fedshift.algorithms.fact import (
    FACT,
    TwoHeadModel,
    aggregate_generators,
    average_heads,
    head_outputs,
    inter_domain_distance,
    more_confident_head,
    scheduled_lr,
    split_generator_head,
)
from fedshift.algorithms.fact_nf import FACTNoFinetune
from fedshift.core.federation import Federation
from fedshift.core.record import Record
from fedshift.core.state import ServerState
from fedshift.engine.assembly import prepare
from fedshift.engine.run.runner import Runner
from fedshift.models import build_model
from fedshift.models.base import FedModel

# -- exact numbers on hand-made tensors ----------------------------------------------


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


def test_the_more_confident_head_is_chosen_by_softmax_maximum_not_by_logit():
    first = torch.tensor([[3.0, 2.9], [1.0, 0.0], [0.0, 0.0]])
    second = torch.tensor([[2.0, 0.0], [0.5, 0.5], [0.0, 0.0]])
    # sample 0: the larger logit is F1's (3 > 2) but F2 is surer: softmax max .881 > .525;
    # sample 1: F1 .731 > F2 .5; sample 2: a tie keeps F1 (the official ">=")
    chosen = more_confident_head(first, second)
    assert torch.equal(chosen, torch.tensor([[2.0, 0.0], [1.0, 0.0], [0.0, 0.0]]))


def test_official_head_outputs_apply_the_losses_to_probabilities():
    logits = torch.tensor([[math.log(3.0), 0.0]])  # softmax [.75, .25]
    assert torch.equal(head_outputs(logits, "logits"), logits)
    probs = head_outputs(logits, "probabilities")
    assert torch.allclose(probs, torch.tensor([[0.75, 0.25]]))
    # the official IDD: softmax of the heads' probabilities, so the same pair of heads is
    # much closer: |softmax([.75, .25]) − softmax([.5, .5])| = e^.5/(e^.5 + 1) − 1/2
    other = torch.zeros(1, 2)
    official = inter_domain_distance(probs, head_outputs(other, "probabilities"))
    expected = math.exp(0.5) / (math.exp(0.5) + 1.0) - 0.5
    assert official.item() == pytest.approx(expected, abs=1e-7)
    assert inter_domain_distance(logits, other).item() == pytest.approx(0.25, abs=1e-7)


def test_fact_defaults_to_the_official_generator_head_split():
    cfg = msst_cfg("fact")
    assert cfg.model == "fact-cnn" and msst_cfg("fact-nf").model == "fact-cnn"
    assert msst_cfg("fact", model="digit5-cnn").model == "digit5-cnn"  # the earlier split
    net = build_model("fact-cnn", 10, in_channels=3, image_size=32)
    generator, head = split_generator_head(net.state_dict())
    assert {k.split(".")[1] for k in generator} == {"conv1", "bn1", "conv2", "bn2"}
    assert net.embed_dim == 128 * 8 * 8
    layers = [m for m in net.head if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in layers] == [
        (8192, 3072),
        (3072, 100),
        (100, 10),
    ]


# -- rounds on a scripted federation ---------------------------------------------------


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


# -- runs ------------------------------------------------------------------------------


def test_fact_nf_run_reports_min_idd_selection(tmp_path, tiny_digits):
    exp = prepare(msst_cfg("fact-nf", rounds=3), dataset=tiny_digits)
    summary = Runner(exp, tmp_path / "run", progress=False).run()
    history = read_history(tmp_path / "run")
    best = min(history, key=lambda h: h["selection_score"])
    assert summary["min_idd_round"] == best["round"]
    assert summary["target_accuracy_min_idd"] == best["target_accuracy"]
    assert summary["bytes_up"] > 0 and summary["bytes_down"] > summary["bytes_up"]
