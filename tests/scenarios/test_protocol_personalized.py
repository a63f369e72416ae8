"""The personalized protocol on a synthetic task: each client is scored on its own test share."""

from __future__ import annotations

from helpers import run_personalized


def test_fedavg_in_the_personalized_protocol_scores_the_global_model_per_client(
    tmp_path, synthetic
):
    summary, history, _ = run_personalized(tmp_path, synthetic, "fedavg", "avg", rounds=1)
    assert history[-1]["target_accuracy"] == history[-1]["personalized_accuracy"]
    assert "personalized_accuracy_std" in summary
