"""The vectorized path honours every key of the ``training`` section or refuses it: each key
is walked with a value other than its default, and either the vectorized replies equal the
sequential ones (within ``TOLERANCE``) or the run falls back to sequential clients and logs
why in one line. A new training key fails here until ``TRAINING_KEYS`` and ``OTHER_VALUE``
decide it. Whole runs (every round's metrics, the final model) are compared too.

Why a tolerance and not bitwise: the vmapped convolutions and BatchNorm reduce in another
order than one client's kernels do, so float32 results differ in the last bits, and on this
small untrained BatchNorm net the differences grow with the steps (up to ~8e-5 per weight
after a few steps of batch 16). The bound is therefore max(1e-5, what the sequential path
itself moves when only its CPU convolution backend changes, oneDNN on/off); a whole run's
accuracies and byte counts match exactly, its losses and final weights within 1e-5.
"""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import torch

from fedshift.config import resolve
from fedshift.core.context import TrainConfig
from fedshift.core.record import Record
from fedshift.core.runconfig import RunConfig, section_keys
from fedshift.core.state import load_checkpoint
from fedshift.engine.assembly import prepare
from fedshift.engine.run.runner import run_experiment
from fedshift.engine.simulation.dispatch import SimulationFederation
from fedshift.engine.simulation.vectorized import (
    TRAINING_KEYS,
    training_blocker,
    vectorize_enabled,
    vectorize_summary,
)

TOLERANCE = 1e-5

#: a value other than the default for every training key: the walk trains with it
OTHER_VALUE = {
    "local_epochs": 2,
    "batch_size": 16,
    "lr": 0.05,
    "momentum": 0.5,
    "weight_decay": 0.0,
    "optimizer": "adam",
}


def experiment(dataset, **settings):
    options = {"algorithm": "fedavg", "target": "mnistm", "rounds": 2, "clients_per_domain": 2}
    options.update(settings)
    return prepare(resolve(None, options, ["device=cpu", "threads=1"]), dataset=dataset)


def first_call(exp, vectorize: bool) -> dict[int, Record]:
    """The replies of round 1's ``train`` call, clients vectorized or one by one."""
    fed = SimulationFederation.for_experiment(exp)
    fed.vectorize = fed.vectorize and vectorize
    fed.begin_round(1)
    sent = Record().with_arrays("model", exp.algorithm.init_state().model)
    return fed.call("train", fed.sample(), sent)


def max_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def kernel_change(dataset, settings: dict, sequential: dict[int, Record]) -> float:
    """How far the sequential path's own replies move when only the CPU convolution backend
    changes (oneDNN on/off): the scale of float32 reduction-order drift on this net."""
    previous = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = not previous
    try:
        other = first_call(experiment(dataset, **settings), vectorize=False)
    finally:
        torch.backends.mkldnn.enabled = previous
    return max(max_difference(sequential[c].arrays, other[c].arrays) for c in sequential)


def test_every_training_key_is_decided_and_walked():
    declared = section_keys("training")
    assert [f.name for f in dataclasses.fields(TrainConfig)] == declared
    assert sorted(TRAINING_KEYS) == sorted(declared), "decide the new key in TRAINING_KEYS"
    assert sorted(OTHER_VALUE) == sorted(declared), "give the new key a value to walk"
    defaults = RunConfig()
    for key, value in OTHER_VALUE.items():
        assert getattr(defaults, key) != value, key


def test_an_unknown_training_key_falls_back():
    """A key that reaches TrainConfig without a decision is refused, not ignored."""
    extended = dataclasses.make_dataclass(
        "Extended", [("label_smoothing", float, 0.1)], bases=(TrainConfig,)
    )
    assert training_blocker(TrainConfig()) is None
    reason = training_blocker(extended())
    assert reason == "training key label_smoothing is not known to the vectorized step"


def test_a_refused_training_key_keeps_auto_on_cuda_sequential():
    """vectorize=auto on CUDA is where a silently ignored key would have hidden."""
    cuda = torch.device("cuda")
    adam = TrainConfig(optimizer="adam")
    assert vectorize_enabled("auto", cuda, "fp32", False, TrainConfig())
    assert not vectorize_enabled("auto", cuda, "fp32", False, adam)
    assert vectorize_summary("auto", cuda, "fp32", False, adam) == (
        "sequential (vectorize=auto, but optimizer=adam: the vectorized step is SGD's "
        "(optimizer=sgd keeps clients vectorized))"
    )


@pytest.mark.parametrize("key", section_keys("training"))
def test_each_training_key_is_honoured_or_falls_back(tiny16_digits, caplog, key):
    settings = {key: OTHER_VALUE[key], "vectorize": "on"}
    sequential = first_call(experiment(tiny16_digits, **settings), vectorize=False)
    exp = experiment(tiny16_digits, **settings)
    reason = TRAINING_KEYS[key](OTHER_VALUE[key])
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        together = first_call(exp, vectorize=True)
    assert sequential.keys() == together.keys() and len(sequential) >= 4
    if reason is None:
        assert "run sequentially" not in caplog.text
        # the same order as a kernel change's drift, within 2x (see test_vectorized.py)
        bound = max(TOLERANCE, 2.0 * kernel_change(tiny16_digits, settings, sequential))
        worst = max(max_difference(sequential[c].arrays, together[c].arrays) for c in sequential)
        assert 0 < worst <= bound, (key, worst, bound)  # 0: the clients ran one by one
    else:  # fell back: the very same sequential computation, and one line says why
        lines = [r.getMessage() for r in caplog.records if "run sequentially" in r.getMessage()]
        assert lines == [f"vectorize=on: clients run sequentially; {reason}"]
        bound = 0.0
        assert all(
            max_difference(sequential[c].arrays, together[c].arrays) == 0 for c in sequential
        )
    for cid in sequential:
        assert sequential[cid].metrics["samples"] == together[cid].metrics["samples"]
        assert abs(sequential[cid].metrics["loss"] - together[cid].metrics["loss"]) <= bound


#: what a round's metrics line may differ in between the two runs: time, and the training loss
#: by float32 reduction order
TIMES = {"cpu_seconds", "seconds"}


@pytest.mark.parametrize("settings", [{}, {"algorithm": "fedprox", "algo.mu": 0.5}])
def test_vectorized_and_sequential_runs_agree_round_by_round(tiny16_digits, tmp_path, settings):
    """Two rounds of a whole run with vectorize=on and off: each round's training loss
    within TOLERANCE and every other figure (accuracies, bytes, failures) equal; the final
    global weights within TOLERANCE."""
    options = {"algorithm": "fedavg", "target": "mnistm", "rounds": 2, "clients_per_domain": 2}
    options.update(settings)
    lines, models = {}, {}
    for mode in ("off", "on"):
        cfg = resolve(None, options, ["device=cpu", "threads=1", f"vectorize={mode}"])
        _, out = run_experiment(cfg, tmp_path / mode, progress=False, dataset=tiny16_digits)
        lines[mode] = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        models[mode] = load_checkpoint(out / "checkpoint.pt")["server"]["model"]
    assert [x["round"] for x in lines["on"]] == [x["round"] for x in lines["off"]] == [1, 2]
    for off, on in zip(lines["off"], lines["on"], strict=True):
        assert off.keys() == on.keys()
        assert abs(off.pop("train_loss") - on.pop("train_loss")) <= TOLERANCE
        assert {k: v for k, v in off.items() if k not in TIMES} == {
            k: v for k, v in on.items() if k not in TIMES
        }
    assert max_difference(models["off"], models["on"]) <= TOLERANCE
