"""benchmarks/fidelity/fedproto_official_eval.py: the official FedProto running-ratio formula."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks" / "fidelity"


def test_running_ratios_pool_both_passes_and_never_reset(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    official = importlib.import_module("fedproto_official")
    # (head correct, prototype correct, test images) of three clients
    counts = [(9, 10, 10), (2, 4, 5), (30, 27, 30)]
    # client 0: 19 / 20; clients 0-1: 25 / 30; clients 0-2: 82 / 90
    assert official.official_running_ratios(counts) == [95.0, 100 * 25 / 30, 100 * 82 / 90]
    assert official.official_running_ratios([]) == []


def test_a_folder_without_a_finished_run_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "fedproto_official_eval.py"), str(tmp_path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {tmp_path} holds no checkpoint.pt (not a finished run)"


def test_a_corrupt_checkpoint_is_one_line_and_exit_2_in_both_scripts(tmp_path):
    (tmp_path / "checkpoint.pt").write_bytes(b"not a checkpoint" * 64)
    for script in ("fedproto_official_eval.py", "fedproto_official_draw.py"):
        done = subprocess.run(
            [sys.executable, str(BENCHMARKS / script), str(tmp_path)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode == 2, (script, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: checkpoint "), (script, lines)
        assert "corrupt" in lines[0] and done.stdout == ""
