"""Ditto: personal models stay on the clients."""

from __future__ import annotations

from helpers import run


def test_ditto_keeps_personal_models(tmp_path, tiny_digits):
    summary, runner = run(tmp_path, "ditto", tiny_digits, "ditto")
    assert 0.0 <= summary["personalized_accuracy"] <= 1.0
    assert all("personal" in ctx.state for ctx in runner.exp.contexts.values())
    assert runner.fed.seen_shares == {"model"}
