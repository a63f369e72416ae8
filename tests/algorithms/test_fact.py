"""FACT and FACT-NF: exact numbers on hand-made tensors, rounds on a scripted federation,
and a run reporting min-IDD model selection."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
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
from fedshift.core.errors import ConfigError
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


def _target_reply(generator: float, heads: tuple[float, float], **metrics) -> Record:
    """The target's reply: G_t and both heads (with the target's BN statistics)."""
    reply = _model_reply({"backbone.w": generator}, **metrics)
    for i, value in enumerate(heads):
        reply.arrays[f"heads.{i}.head.b"] = torch.tensor([value])
    return reply


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
            "idd": {3: _target_reply(7.0, (11.0, 21.0), idd=0.125)},
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
    # new global: G = G_t, F = mean of the heads as the target returned them
    assert state.model["backbone.w"].item() == 7.0
    assert state.model["head.b"].item() == 16.0
    assert [h["head.b"].item() for h in state.extra["heads"]] == [11.0, 21.0]
    assert metrics["selection_score"] == metrics["idd"] == 0.125
    assert metrics["train_loss"] == 2.0


def test_fact_nf_skips_finetuning_and_averages_trained_heads():
    fed = ScriptedFederation(
        {
            "train": {
                0: _model_reply({"backbone.w": 1.0, "head.b": 4.0}, loss=1.0),
                2: _model_reply({"backbone.w": 5.0, "head.b": 8.0}, loss=1.0),
            },
            "idd": {3: _target_reply(-1.0, (4.0, 8.0), idd=0.5)},
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


def test_fact_target_step_equals_the_official_step(tiny_digits):
    """The ``idd`` task against the official client's ``_train_at_target_data`` written out
    in plain PyTorch on the same inputs: G and both heads in training mode (dropout on, the
    heads' BatchNorm statistics adapting), SGD (momentum 0.9, weight decay 5e-4) on G only,
    the official discrepancy; G_t and both heads come back with the target's statistics."""
    exp = prepare(msst_cfg("fact", rounds=1, local_epochs=1), dataset=tiny_digits)
    algo, ctx = exp.algorithm, exp.contexts[max(exp.contexts)]
    assert ctx.role == "target"
    torch.manual_seed(11)
    model = ctx.build_model()
    torch.manual_seed(12)
    other = ctx.build_model()  # a second, different head (as two sources would send)
    generator, first = split_generator_head(model.state_dict())
    _, second = split_generator_head(other.state_dict())
    sent = Record().with_arrays("model", generator)
    sent.with_arrays("heads.0", first).with_arrays("heads.1", second)
    rng_state = ctx.rng.get_state()

    torch.manual_seed(5)  # dropout's stream
    reply = algo.run_task("idd", ctx, sent)

    # the official step, by hand
    ctx.rng.set_state(rng_state)
    g = copy.deepcopy(model.backbone).train()
    c1 = copy.deepcopy(model.head).train()
    c2 = copy.deepcopy(other.head).train()
    opt_g = torch.optim.SGD(g.parameters(), lr=algo.hp.lr, momentum=0.9, weight_decay=0.0005)
    opt_c1 = torch.optim.SGD(c1.parameters(), lr=algo.hp.lr, momentum=0.9, weight_decay=0.0005)
    opt_c2 = torch.optim.SGD(c2.parameters(), lr=algo.hp.lr, momentum=0.9, weight_decay=0.0005)
    torch.manual_seed(5)
    discrepancies = []
    for x, _ in ctx.train.batches(algo.hp.batch_size, ctx.rng, labels=False):
        if len(x) < 2:
            continue
        feat = g(x)
        out1, out2 = c1(feat), c2(feat)
        loss = torch.mean(torch.abs(F.softmax(out1, dim=1) - F.softmax(out2, dim=1)))
        loss.backward()
        opt_g.step()
        for opt in (opt_g, opt_c1, opt_c2):
            opt.zero_grad()
        discrepancies.append(float(loss.detach()))

    def same(got: dict, want: dict) -> None:
        assert set(got) == set(want)
        for key, value in want.items():
            assert torch.allclose(got[key].float(), value.float(), atol=1e-6), key

    same(reply.subset("model"), {f"backbone.{k}": v for k, v in g.state_dict().items()})
    same(reply.subset("heads.0"), {f"head.{k}": v for k, v in c1.state_dict().items()})
    same(reply.subset("heads.1"), {f"head.{k}": v for k, v in c2.state_dict().items()})
    assert reply.metrics["idd"] == pytest.approx(sum(discrepancies) / len(discrepancies))
    # the heads' weights as sent, their BatchNorm statistics moved to the target's
    assert torch.equal(reply.subset("heads.0")["head.fc1.weight"], first["head.fc1.weight"])
    moved = [k for k in first if "running_mean" in k]
    assert moved and all(not torch.equal(reply.subset("heads.0")[k], first[k]) for k in moved)


def test_model_selection_algorithm_reports_the_min_idd_round(tmp_path, tiny_digits):
    """FACT's paper selects by minimal IDD: the summary reports the min-IDD round (with
    ``model_selection=algorithm`` as its headline, the source-validation one kept beside it).
    One 3-round FACT-NF run checks both (they were two runs of the same config)."""
    exp = prepare(msst_cfg("fact-nf", rounds=3, model_selection="algorithm"), dataset=tiny_digits)
    summary = Runner(exp, tmp_path / "run", progress=False).run()
    history = read_history(tmp_path / "run")
    best = min(history, key=lambda h: h["selection_score"])
    assert summary["min_idd_round"] == best["round"]
    assert summary["target_accuracy_min_idd"] == best["target_accuracy"]
    assert summary["model_selection"] == "min_idd"
    assert summary["selected_round"] == summary["min_idd_round"] == best["round"]
    assert summary["target_accuracy"] == best["target_accuracy"]
    assert "target_accuracy_source_val" in summary
    # FACT-NF moves (G, F) down and up at each source, (G', F1, F2) down and (G_t, F1, F2)
    # up at the target (the official target returns both heads): as many bytes each way
    assert summary["bytes_up"] > 0 and summary["bytes_down"] == summary["bytes_up"]


def test_model_selection_algorithm_needs_a_label_free_score():
    with pytest.raises(ConfigError, match="no label-free selection score"):
        msst_cfg("fada", model_selection="algorithm")
