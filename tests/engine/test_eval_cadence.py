"""``source_eval_every``: the source domains' val/test scored every N rounds and in the last,
the held-out target every round; model selection by source validation uses only the rounds
that scored it."""

from __future__ import annotations

import pytest
from helpers import cfg, read_history, run
from test_catalog_segmentation_sets import _fundus_tree, _run_argv

from fedshift.cli import main
from fedshift.core.errors import ConfigError
from fedshift.data.catalog import CATALOG
from fedshift.engine.run.runner import progress_postfix
from fedshift.engine.run.selection import SOURCE_VAL, select

TARGET = "optdigits"


def test_sources_scored_every_n_rounds_and_the_target_every_round(tmp_path, micro_digits):
    run(tmp_path, "c", micro_digits, "fedavg", rounds=4, source_eval_every=3)
    rows = read_history(tmp_path / "c")
    assert ["source_val_accuracy" in row for row in rows] == [False, False, True, True]
    assert all("target_accuracy" in row for row in rows)
    assert list(rows[0]["per_domain_accuracy"]) == [TARGET]
    assert set(rows[2]["per_domain_accuracy"]) == set(micro_digits.domain_names)


def test_target_scores_equal_a_run_scoring_every_domain(tmp_path, micro_digits):
    run(tmp_path, "all", micro_digits, "fedavg", rounds=3)
    run(tmp_path, "some", micro_digits, "fedavg", rounds=3, source_eval_every=2)
    every = read_history(tmp_path / "all")
    some = read_history(tmp_path / "some")
    assert [r["target_accuracy"] for r in every] == [r["target_accuracy"] for r in some]


def test_selection_picks_among_rounds_with_source_validation(tmp_path, micro_digits):
    summary, _ = run(tmp_path, "s", micro_digits, "fedavg", rounds=4, source_eval_every=2)
    assert summary["selected_round"] in (2, 4)
    assert set(summary["per_domain_accuracy"]) == set(micro_digits.domain_names)


def test_selection_without_a_finite_validation_takes_a_round_that_reports_it():
    nan = float("nan")
    history = [
        {"round": 1, "target_accuracy": 0.9, "per_domain_accuracy": {TARGET: 0.9}},
        {"round": 2, "target_accuracy": 0.5, "source_val_accuracy": nan},
        {"round": 3, "target_accuracy": 0.4, "source_val_accuracy": nan},
    ]
    assert select(history, SOURCE_VAL)["round"] == 2


def test_source_eval_every_must_be_positive():
    with pytest.raises(ConfigError, match="source_eval_every"):
        cfg("fedavg", source_eval_every=0)


def test_segmentation_channels_of_a_round_without_sources_cover_the_target(tmp_path):
    """Fundus (disc and cup): a round that skips the sources still reports the target's
    per-channel Dice; the last round scores every site."""
    root = _fundus_tree(tmp_path / "data")
    argv = _run_argv("fundus", "client1", root, tmp_path / "run")
    argv[argv.index("--rounds") + 1] = "2"
    assert main([*argv, "--set", "source_eval_every=5"]) == 0
    rows = read_history(tmp_path / "run")
    assert list(rows[0]["per_domain_channel_dice"]) == ["client1"]
    assert set(rows[0]["target_channel_dice"]) == {"disc", "cup"}
    assert "source_val_accuracy" not in rows[0]
    assert set(rows[1]["per_domain_channel_dice"]) == set(CATALOG["fundus"].domains)


def test_the_progress_bar_shows_what_the_round_measured_and_no_nan(tmp_path, micro_digits):
    """A round that is not evaluated (eval_every=2) shows its loss alone, never target=nan."""
    run(tmp_path, "bar", micro_digits, "fedavg", rounds=2, eval_every=2)
    first, second = read_history(tmp_path / "bar")
    assert progress_postfix(first) == {"loss": f"{first['train_loss']:.3f}"}
    assert progress_postfix(second) == {
        "loss": f"{second['train_loss']:.3f}",
        "target": f"{second['target_accuracy']:.3f}",
    }
