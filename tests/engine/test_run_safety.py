"""Runs that fail honestly and can roll back: a round nobody replied to fails under every
policy, run files are strict JSON, reply metrics are bounded, and a poisoned checkpoint can
be rolled back with ``--resume previous``."""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest
import torch
from test_cli_errors import TINY, interrupt_in_round, one_line
from test_reply_validation import check, honest

from fedshift.cli import main
from fedshift.core.errors import CheckpointError, RoundFailed
from fedshift.core.runfiles import NONFINITE, RunFiles, strict_json
from fedshift.core.state import load_checkpoint
from fedshift.report.table import format_summary


def strict_loads(text: str):
    """``json.loads`` that refuses ``NaN``/``Infinity`` (not JSON) instead of reading them."""

    def refuse(name: str):
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_resilient_with_every_client_failing_is_one_line(in_tmp, capsys):
    argv = ["run", *TINY, "--out", "r", "--set", "failure_policy=resilient"]
    line = one_line(capsys, 2, [*argv, "--set", "faults=raise@1:*"], "none of 3 clients replied")
    assert "failure_policy=resilient" in line
    assert not (in_tmp / "r" / "summary.json").exists()


def test_non_finite_values_are_written_as_null_and_listed(tmp_path):
    files = RunFiles(tmp_path)
    row = {"round": 1, "train_loss": float("nan"), "per": {"a": float("inf"), "b": 0.5}}
    files.append_metrics(row)
    files.write_summary({"algorithm": "x", "target": "t", "seed": 0, "acc": -float("inf")})
    written = strict_loads(files.metrics.read_text())
    assert written["train_loss"] is None and written["per"] == {"a": None, "b": 0.5}
    assert written[NONFINITE] == ["train_loss", "per.a"]
    summary = strict_loads(files.summary.read_text())
    assert summary["acc"] is None and summary[NONFINITE] == ["acc"]
    assert NONFINITE not in strict_loads(strict_json({"round": 2, "loss": 0.25}))


def test_a_runs_files_are_strict_json(in_tmp):
    assert main(["run", *TINY, "--out", "r"]) == 0
    for line in (in_tmp / "r" / "metrics.jsonl").read_text().splitlines():
        strict_loads(line)
    strict_loads((in_tmp / "r" / "summary.json").read_text())
    strict_loads((in_tmp / "r" / "config.json").read_text())


@pytest.mark.parametrize("key", ["loss", "accuracy"])
def test_a_reply_metric_beyond_max_reply_value_is_refused(key):
    assert "beyond max_reply_value=1e+06" in check(honest(**{key: 1e308}))
    assert "beyond max_reply_value" in check(honest(**{key: -2e6}))
    assert check(honest(**{key: 1e308}), max_value=0) is None  # the bound is off


def test_sample_counts_are_bounded_by_the_data_size_not_max_reply_value():
    reply = honest()
    reply.metrics.update({"num-examples": 40, "samples": 2_000})
    assert check(reply, max_value=100, data_size=50) is None


def failing_in_round_3(in_tmp, capsys, monkeypatch) -> str:
    """A 3-round run in ``r`` whose round 3 fails; the error line."""
    with monkeypatch.context() as patch:
        interrupt_in_round(patch, 3, RoundFailed("round 3: 0 of 3 clients replied"))
        return one_line(capsys, 2, ["run", *TINY, "--rounds", "3", "--out", "r"], "round 3")


def test_a_failed_round_names_the_rollback(in_tmp, capsys, monkeypatch):
    line = failing_in_round_3(in_tmp, capsys, monkeypatch)
    assert "resume with --resume --out r" in line
    assert line.endswith("fedshift run --out r --resume previous")


def test_rolling_back_restores_the_previous_checkpoint_and_cuts_the_metrics(
    in_tmp, capsys, monkeypatch
):
    failing_in_round_3(in_tmp, capsys, monkeypatch)
    files = RunFiles(in_tmp / "r")
    previous = load_checkpoint(files.previous_checkpoint, fallback=False)
    assert previous["round"] == 1 and len(files.history()) == 2
    assert files.roll_back() == 1
    latest = load_checkpoint(files.checkpoint, fallback=False)
    assert latest["round"] == 1
    model = latest["server"]["model"]
    assert all(torch.equal(model[k], previous["server"]["model"][k]) for k in model)
    assert [row["round"] for row in files.history()] == [1]


def test_resume_previous_continues_bit_identically(in_tmp, capsys, monkeypatch):
    """Rolled back from round 2 to round 1 and run on, the run ends with exactly the model
    and rows of a straight 3-round run (every round's randomness is derived from its number)."""
    assert main(["run", *TINY, "--rounds", "3", "--out", "straight"]) == 0
    failing_in_round_3(in_tmp, capsys, monkeypatch)
    assert main(["run", "--out", "r", "--resume", "previous", "--quiet"]) == 0, capsys
    straight = load_checkpoint(in_tmp / "straight" / "checkpoint.pt")
    rolled = load_checkpoint(in_tmp / "r" / "checkpoint.pt")
    assert rolled["round"] == 3
    for key, value in straight["server"]["model"].items():
        assert torch.equal(rolled["server"]["model"][key], value), key

    def without_time(rows):
        timings = ("seconds", "cpu_seconds")
        return [{k: v for k, v in row.items() if k not in timings} for row in rows]

    assert without_time(RunFiles(in_tmp / "r").history()) == without_time(
        RunFiles(in_tmp / "straight").history()
    )


def test_resume_previous_without_a_previous_checkpoint_is_one_line(in_tmp, capsys):
    assert main(["run", *TINY, "--out", "r"]) == 0
    (in_tmp / "r" / "checkpoint.prev.pt").unlink(missing_ok=True)
    kept = (in_tmp / "r" / "metrics.jsonl").read_text()
    one_line(capsys, 2, ["run", "--out", "r", "--resume", "previous"], "no checkpoint.prev.pt")
    assert (in_tmp / "r" / "metrics.jsonl").read_text() == kept
    shutil.rmtree(in_tmp / "r")
    with pytest.raises(CheckpointError, match="no checkpoint.prev.pt"):
        RunFiles(in_tmp / "r").roll_back()


def test_a_late_config_error_leaves_no_folder_and_no_lock(in_tmp, capsys):
    one_line(capsys, 2, ["run", *TINY, "--out", "r", "--set", "min_clients=4"], "min_clients=4")
    assert not (in_tmp / "r").exists()
    (in_tmp / "empty").mkdir()
    one_line(capsys, 2, ["run", *TINY, "--out", "empty", "--set", "min_clients=4"], "min_clients")
    assert list((in_tmp / "empty").iterdir()) == []


def test_a_read_only_folder_is_called_read_only(in_tmp, capsys, monkeypatch):
    def read_only(fd, data):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(os, "write", read_only)
    line = one_line(capsys, 2, ["run", *TINY, "--out", "r"], "r is read-only: make it writable")
    assert "free some space" not in line


def test_report_on_summaries_without_metrics_says_so(in_tmp, capsys):
    run = in_tmp / "runs" / "r"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"algorithm": "a", "target": "t", "seed": 0}))
    one_line(capsys, 2, ["report", "runs"], "no readable summary under runs")


def test_report_skips_a_metric_written_as_null(in_tmp, capsys):
    for seed, value in ((0, 0.5), (1, None)):
        run = in_tmp / "runs" / f"s{seed}"
        run.mkdir(parents=True)
        summary = {"algorithm": "a", "target": "t", "seed": seed, "target_accuracy": value}
        (run / "summary.json").write_text(json.dumps(summary))
    assert main(["report", "runs"]) == 0
    assert "| a | 50.0 | 50.0 |" in capsys.readouterr().out


def test_a_sweep_into_a_run_directory_is_refused(in_tmp, capsys):
    assert main(["run", *TINY, "--out", "r"]) == 0
    before = sorted(p.name for p in (in_tmp / "r").iterdir())
    argv = ["sweep", "-a", "fedavg", "-t", "optdigits", "--out", "r", "--set", "rounds=1"]
    one_line(capsys, 2, argv, "cannot use --out r: it is a run directory")
    assert sorted(p.name for p in (in_tmp / "r").iterdir()) == before


def test_segmentation_tables_say_dice():
    summary = {
        "algorithm": "fedavg",
        "dataset": "prostate",
        "protocol": "lodo",
        "target": "a",
        "seed": 0,
        "rounds": 1,
        "problem": "segmentation",
        "per_domain_accuracy": {"a": 0.5},
        "selected_round": 1,
        "target_accuracy": 0.5,
        "target_accuracy_last": 0.5,
        "oracle_round": 1,
        "target_accuracy_oracle": 0.5,
        "bytes_up": 1,
        "bytes_down": 1,
        "wall_seconds": 1.0,
        "samples_per_second": 1.0,
    }
    text = format_summary(summary)
    assert "test Dice %" in text and "target Dice (last round): 50.00" in text
    assert "accuracy" not in text
    assert "target accuracy (last round)" in format_summary({**summary, "problem": "x"})
