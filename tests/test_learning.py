"""Does it learn? (slow tier: `pytest -m slow`)."""

from __future__ import annotations

import pytest

from fedshift.config import resolve
from fedshift.engine.run.runner import run_experiment


@pytest.mark.slow
def test_fedavg_learns_digits_dg(tmp_path, digits):
    cfg = resolve(None, {"algorithm": "fedavg", "target": "mnist", "rounds": 5}, ["device=cpu"])
    summary, _ = run_experiment(cfg, tmp_path / "run", progress=False, dataset=digits)
    # chance is 10%; the printed and photo-textured sources transfer well to MNIST
    assert summary["target_accuracy"] > 0.80
    assert summary["source_val_accuracy"] > 0.85
