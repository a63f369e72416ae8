"""benchmarks/gpu/gpu_window_pacs_table.py: the table's rows (each finished cell once), the
per-seed pivot, and what the archive that travels between windows holds."""

from __future__ import annotations

import importlib
import json
import tarfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "gpu_window_pacs_table.py"


@pytest.fixture
def table(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    return importlib.import_module("gpu_window_pacs_table")


def _run(folder: Path, name: str, *, finished: bool, checkpoint_bytes: int = 0) -> None:
    """A run directory as a sweep leaves it; a summary when ``finished``."""
    algorithm, target, seed = name.rsplit("-", 2)
    run = folder / name
    run.mkdir(parents=True)
    (run / ".fedshift-run").write_text("fedshift run directory\n")
    (run / ".lock").write_text("")
    (run / "config.json").write_text(json.dumps({"algorithm": algorithm}))
    (run / "metrics.jsonl").write_text('{"round": 1}\n')
    if checkpoint_bytes:
        (run / "checkpoint.pt").write_bytes(b"\0" * checkpoint_bytes)
        (run / "checkpoint.prev.pt").write_bytes(b"\0" * checkpoint_bytes)
    if finished:
        summary = {
            "algorithm": algorithm,
            "target": target,
            "seed": int(seed[1:]),
            "rounds": 30,
            "target_accuracy": 0.75,
            "selected_round": 28,
            "target_accuracy_last": 0.7,
            "wall_seconds": 123.4,
        }
        (run / "summary.json").write_text(json.dumps(summary))


def test_rows_are_appended_once_per_finished_cell(table, tmp_path):
    _run(tmp_path, "fedavg-sketch-s0", finished=True)
    _run(tmp_path, "fedga-sketch-s0", finished=False, checkpoint_bytes=10)
    assert table.append_rows(tmp_path, "NVIDIA H100", "abc1234") == ["fedavg-sketch-s0"]
    assert table.append_rows(tmp_path, "NVIDIA H100", "abc1234") == []
    _run(tmp_path, "fedsr-sketch-s0", finished=True)
    assert table.append_rows(tmp_path, "NVIDIA H200", "def5678") == ["fedsr-sketch-s0"]
    lines = (tmp_path / "table.md").read_text().splitlines()
    assert lines[:2] == table.HEADER and len(lines) == 4
    cells = [c.strip() for c in lines[2].split("|")[1:-1]]
    assert cells[:6] == ["fedavg-sketch-s0", "fedavg", "sketch", "0", "30", "75.0 (round 28)"]
    assert cells[6:10] == ["70.0", "123", "NVIDIA H100", "abc1234"]
    assert "NVIDIA H200" in lines[3] and "def5678" in lines[3]


def test_pivot_means_only_complete_rows(table, tmp_path):
    _run(tmp_path, "fedavg-sketch-s0", finished=True)
    _run(tmp_path, "fedavg-photo-s0", finished=True)
    _run(tmp_path, "fedga-sketch-s0", finished=True)
    _run(tmp_path, "fedga-sketch-s1", finished=True)
    lines = table.pivot(table.finished(tmp_path), ["fedavg", "fedga"], ["photo", "sketch"], 0)
    assert "| fedavg | 75.0 | 75.0 | 75.0 |" in lines
    assert "| fedga | - | 75.0 | - |" in lines


def test_the_archive_holds_what_a_later_window_needs(table, tmp_path):
    folder = tmp_path / "table"
    _run(folder, "fedavg-sketch-s0", finished=True, checkpoint_bytes=1000)
    _run(folder, "fedga-sketch-s0", finished=False, checkpoint_bytes=1000)
    _run(folder, "fedsr-sketch-s0", finished=False, checkpoint_bytes=3 * 2**20)
    table.append_rows(folder, "cpu", "abc")
    left_out = table.pack(folder, tmp_path / "state.tgz", max_mb=2)
    assert left_out == ["fedsr-sketch-s0"]  # its checkpoint does not fit: it starts again
    with tarfile.open(tmp_path / "state.tgz") as tar:
        names = set(tar.getnames())
    assert "table.md" in names
    assert {"fedavg-sketch-s0/summary.json", "fedavg-sketch-s0/.fedshift-run"} <= names
    assert "fedavg-sketch-s0/checkpoint.pt" not in names  # finished: not needed
    assert "fedga-sketch-s0/checkpoint.pt" in names  # resumes from it
    assert not any(n.endswith((".lock", "checkpoint.prev.pt")) for n in names)
    assert not any(n.startswith("fedsr-sketch-s0") for n in names)
