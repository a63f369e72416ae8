"""PerAda: the KD loss and candidate selection (exact numbers), the pretrained-backbone
requirements, and runs that share adapters and validated KD steps."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import cfg, read_history, run

from fedshift.algorithms.perada import kd_loss, select_candidate
from fedshift.core.errors import ConfigError
from fedshift.engine.assembly import prepare


def test_kd_loss_exact():
    student = torch.tensor([[0.0, 0.0]])
    teacher = torch.tensor([[math.log(3.0), 0.0]])
    expected = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    assert float(kd_loss(student, teacher, 1.0)) == pytest.approx(expected, abs=1e-6)
    p = 3**0.5 / (3**0.5 + 1)  # τ = 2 halves the teacher's logit gap
    expected = p * math.log(p / 0.5) + (1 - p) * math.log((1 - p) / 0.5)
    batch = kd_loss(student.repeat(2, 1), teacher.repeat(2, 1), 2.0)
    assert float(batch) == pytest.approx(expected, abs=1e-6)  # batch mean


def test_perada_refuses_random_weights(tiny_digits):
    with pytest.raises(ConfigError, match="fedshift pretrain"):
        prepare(cfg("perada", sources="mnist,mnistm", server_data="syn"), dataset=tiny_digits)


def test_perada_keeps_the_pretraining_domain_out(backbone, tiny_digits):
    with pytest.raises(ConfigError, match="pretrained on domain 'syn'"):
        prepare(cfg("perada", **{"algo.backbone": backbone}), dataset=tiny_digits)
    with pytest.raises(ConfigError, match="held by a client"):
        prepare(cfg("fedavg", sources="mnist,syn", server_data="mnist"), dataset=tiny_digits)


def perada_settings(backbone, **extra) -> dict:
    """Clients mnist and mnistm, the server's unlabeled data syn (the backbone's domain)."""
    return {"sources": "mnist,mnistm", "server_data": "syn", "algo.backbone": backbone, **extra}


def test_perada_shares_adapters_and_validation_counts(tmp_path, tiny_digits, backbone):
    settings = perada_settings(backbone, **{"algo.kd_steps": 5})
    summary, runner = run(tmp_path, "perada", tiny_digits, "perada", **settings)
    algo = runner.exp.algorithm
    adapter_bytes = sum(t.numel() * t.element_size() for t in algo.init_state().model.values())
    # per round and client: the local adapter, then one int64 count for each of the two KD
    # candidates (the average and the 5th, last KD step) scored on its validation split
    assert runner.fed.seen_shares == {"adapter", "kd_val"}
    assert summary["bytes_up"] == 2 * 2 * (adapter_bytes + 2 * 8)  # 2 rounds × 2 clients
    assert 0.0 <= summary["personalized_accuracy"] <= 1.0
    # the frozen backbone is the pretrained one, untouched by training
    net = algo.global_model(runner.exp.algorithm.init_state())
    pretrained = torch.load(backbone, weights_only=True)
    for key, value in net.backbone.state_dict().items():
        assert torch.equal(value, pretrained[f"backbone.{key}"]), key


def test_perada_kd_selection_prefers_the_average_unless_beaten():
    counts = torch.tensor([100.0, 50.0])
    # candidate 0 is the average; pooled accuracies: 0.80, 0.80, 0.90, 0.90
    correct = torch.tensor([[80, 80, 95, 90], [40, 40, 40, 45]])
    assert select_candidate(correct, counts) == 2  # best, and the earlier of two equals
    # a tie with the average keeps the average (the official code's fallback)
    assert select_candidate(torch.tensor([[70, 70], [35, 35]]), counts) == 0
    # pooled over samples (110/150 vs 105/150), not a mean of the clients' accuracies
    # (0.65 vs 0.75, which would pick candidate 1)
    assert select_candidate(torch.tensor([[90, 60], [20, 45]]), counts) == 0


def test_perada_kd_keeps_a_validated_step(tmp_path, tiny_digits, backbone):
    settings = perada_settings(backbone, **{"algo.kd_steps": 6, "algo.kd_eval_every": 2})

    def history(name, **extra):
        run(tmp_path, name, tiny_digits, "perada", **settings, **extra)
        return read_history(tmp_path / name)

    # candidates: the average (step 0) and the snapshots after KD steps 2, 4 and 6
    assert all(h["kd_selected_step"] in (0.0, 2.0, 4.0, 6.0) for h in history("val"))
    # kd_selection=last keeps the last step without asking the clients
    last = history("last", **{"algo.kd_selection": "last"})
    assert all("kd_selected_step" not in h for h in last)
    with pytest.raises(ConfigError, match="kd_selection"):
        prepare(cfg("perada", **{**settings, "algo.kd_selection": "best"}), dataset=tiny_digits)
