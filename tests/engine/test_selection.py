"""Score-based model selection over a run's history (e.g. FACT's min-IDD)."""

from __future__ import annotations

from fedshift.engine.run.selection import score_selection


def test_score_selection_picks_the_lowest_first():
    history = [
        {"round": 1, "target_accuracy": 0.1, "selection_score": 0.3},
        {"round": 2, "target_accuracy": 0.5, "selection_score": 0.1},
        {"round": 3, "target_accuracy": 0.7, "selection_score": 0.1},
        {"round": 4, "target_accuracy": 0.9},
    ]
    assert score_selection("min_idd").pick(history)["round"] == 2
    assert score_selection("max", lower_is_better=False).pick(history)["round"] == 1
    assert score_selection("min_idd").pick([{"round": 1, "target_accuracy": 0.2}]) is None
