"""The scripts in examples/ run (with --smoke: one round on a tenth of the data)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

from fedshift.algorithms import REGISTRY
from fedshift.data.custom import _REGISTERED
from fedshift.models.cards import CARDS
from fedshift.models.registry import _FOUND

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py"))


def test_every_example_is_tested():
    assert SCRIPTS == [
        "custom_algorithm.py",
        "custom_dataset.py",
        "custom_model.py",
        "run_python_api.py",
        "server_momentum.py",
        "sweep_and_report.py",
    ]


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs(script, in_tmp, monkeypatch, capsys):
    """Each script in-process (its registrations undone afterwards), output in a temp folder."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(sys, "argv", [script, "--smoke", "--out", str(in_tmp / "out")])
    saved = dict(REGISTRY), dict(CARDS), dict(_FOUND), dict(_REGISTERED)
    try:
        runpy.run_path(str(EXAMPLES / script), run_name="__main__")
    finally:
        for live, before in zip((REGISTRY, CARDS, _FOUND, _REGISTERED), saved, strict=True):
            live.clear()
            live.update(before)
    out = capsys.readouterr().out
    assert "accuracy" in out
    assert "Traceback" not in out
    assert any((in_tmp / "out").rglob("summary.json"))
