"""Registry-driven contract: every algorithm must pass these on a tiny real task."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import FAST_SETTINGS, read_history

from fedshift.algorithms import REGISTRY
from fedshift.config import resolve
from fedshift.core.context import TrainConfig
from fedshift.core.state import load_checkpoint
from fedshift.engine.assembly import prepare
from fedshift.engine.run.runner import Runner
from fedshift.pretrain import pretrain

ROUNDS = 2  # the resume check stops after round 1 and resumes the second


def make_cfg(algorithm: str, **overrides):
    settings = [
        f"{k}={v}"
        for k, v in {"rounds": ROUNDS, "batch_size": 32, "device": "cpu", **overrides}.items()
    ]
    protocol = (REGISTRY[algorithm].protocols or ("lodo",))[0]
    flags = {"algorithm": algorithm, "target": "optdigits", "protocol": protocol}
    return resolve(None, flags, settings)


def backbone_settings(cls, tmp_path, dataset) -> dict:
    """A real pretrained backbone for algorithms that need one (PerAda): trained on syn,
    which then stays out of the federation (sources mnist, mnistm) and is the server's data."""
    if not cls.needs_pretrained_backbone:
        return {}
    path = tmp_path / "backbone-syn.pt"
    if not path.exists():
        pretrain(dataset, "syn", path, train=TrainConfig(batch_size=32), epochs=1)
    return {"sources": "mnist,mnistm", "server_data": "syn", "algo.backbone": path}


def run(tmp_path, name, algorithm, dataset, *, resume=False, stop_after=None, **overrides):
    overrides = {
        **backbone_settings(REGISTRY[algorithm], tmp_path, dataset),
        **FAST_SETTINGS.get(algorithm, {}),
        **overrides,
    }
    exp = prepare(make_cfg(algorithm, **overrides), dataset=dataset)
    runner = Runner(exp, tmp_path / name, progress=False)
    summary = runner.run(resume=resume, stop_after=stop_after)
    return summary, runner


ACCURACY_KEYS = (
    "target_accuracy",
    "target_accuracy_last",
    "target_accuracy_oracle",
    "source_val_accuracy",
    "per_domain_accuracy",
)


@pytest.mark.parametrize("algorithm", list(REGISTRY))
def test_algorithm_contract(algorithm, tmp_path, tiny16_digits):
    cls = REGISTRY[algorithm]
    assert cls.name == algorithm and cls.paper, "every algorithm names itself and its source"

    summary, runner = run(tmp_path, "a", algorithm, tiny16_digits)
    history = read_history(tmp_path / "a")
    assert len(history) == ROUNDS
    # honest clients pass the reply validation (their replies follow each task's schema)
    assert summary["failed_clients"] == 0, runner.fed.failures
    for entry in history:
        assert math.isfinite(entry["train_loss"]), entry
        assert 0.0 <= entry["target_accuracy"] <= 1.0
    # what left the clients is exactly what the algorithm declares
    assert runner.fed.seen_shares == set(cls.shares)
    if cls.pooled:
        assert summary["bytes_up"] == 0 and summary["bytes_down"] == 0
    elif cls.shares:
        assert summary["bytes_up"] > 0 and summary["bytes_down"] > 0

    # checkpoint round trip: pickle-free load, final round, every client state present
    ckpt = load_checkpoint(tmp_path / "a" / "checkpoint.pt")
    assert ckpt["round"] == ROUNDS
    assert set(ckpt["clients"]) == {str(c) for c in runner.exp.contexts}

    # a second run with the same seed, stopped after round 1 (a fresh process state: new
    # task, algorithm and clients) and resumed from its checkpoint, equals the first run
    # exactly: this checks same seed -> same result and resume == uninterrupted at once
    partial, _ = run(tmp_path, "c", algorithm, tiny16_digits, stop_after=1)
    assert partial == {}
    resumed, _ = run(tmp_path, "c", algorithm, tiny16_digits, resume=True)
    for key in ACCURACY_KEYS:
        assert resumed[key] == summary[key], key
    final = load_checkpoint(tmp_path / "c" / "checkpoint.pt")
    for name, tensor in ckpt["server"]["model"].items():
        assert torch.equal(final["server"]["model"][name], tensor), name
    for cid, state in ckpt["clients"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(final["clients"][cid][key], value), (cid, key)
