"""The ``real`` tier for FedProto's MNIST experiment (preset ``fedproto-mnist``) on a copy that
holds only ``digit-five/mnist/`` (the four official idx files).

The partition is the official code's (20 clients, N-way K-shot with stdev 2, each client's
shots disjoint, 40 test images per class and client, disjoint, from the 10,000 of the test
file), and three rounds of the preset learn: 93.8 % personalized accuracy measured here
(seed 0, 2026-11-28; the published 97.13 is after 100 rounds), asserted >= 85 %.

Runs when ``$FEDSHIFT_REAL_DATA`` names a folder holding ``digit-five/mnist/``; skipped with
the reason otherwise.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedshift.cli import main
from fedshift.config import resolve
from fedshift.data import load_dataset
from fedshift.scenarios.scenario import partition_sources

pytestmark = pytest.mark.real


def test_preset_partition_is_the_official_one(mnist_root, tmp_path):
    cfg = resolve(None, {"preset": "fedproto-mnist"}, [f"data_root={mnist_root}"])
    ds = load_dataset(
        cfg.dataset,
        data_root=mnist_root,
        image_size=cfg.image_size,
        cache_dir=tmp_path,
        catalog_split=cfg.catalog_split,
    )
    mnist = ds.domain("mnist")
    assert len(mnist.train) + len(mnist.val) == 60_000 and len(mnist.test) == 10_000
    assert tuple(mnist.train.x.shape[1:]) == (3, 28, 28)
    specs = partition_sources(cfg, ds, ["mnist"])
    assert len(specs) == 20
    train_rows = np.concatenate([s.train_idx for s in specs])
    test_rows = np.concatenate([s.test_idx for s in specs])
    assert len(np.unique(train_rows)) == len(train_rows)  # shots disjoint across clients
    assert len(np.unique(test_rows)) == len(test_rows)  # test images disjoint too
    y_train, y_test = mnist.train.y.numpy(), mnist.test.y.numpy()
    for spec in specs:
        classes, shots = np.unique(y_train[spec.train_idx], return_counts=True)
        assert 2 <= len(classes) <= 5 and set(shots.tolist()) <= set(range(98, 103))
        test_classes, per_class = np.unique(y_test[spec.test_idx], return_counts=True)
        assert test_classes.tolist() == classes.tolist() and set(per_class.tolist()) == {40}


# a does-it-learn run (~70 s); the default tier reruns the preset's first round bit for bit
# (tests/experiments, prefix of experiments/fedproto-mnist)
@pytest.mark.slow
def test_three_rounds_of_the_preset_learn(mnist_root, tmp_path):
    out = tmp_path / "run"
    args = ["run", "--preset", "fedproto-mnist", "--set", f"data_root={mnist_root}"]
    args += ["--rounds", "3", "--set", "threads=1", "--device", "cpu", "--quiet", "--out", str(out)]
    assert main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["personalized_accuracy"] >= 0.85
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    scored = [row["round"] for row in rows if "personalized_accuracy" in row]
    assert scored == [3]  # scored once, after the last round, as the official code
