"""The prepared GPU command runs every step on the CPU with ``--dry-run``, so a short GPU
window never meets an untested step."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

from test_catalog_loaders import _pacs_tree

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "gpu_window.sh"
STEPS = ("gpu-tests", "throughput", "vmap", "resnet", "input", "pacs", "pacs-table", "uda")


def test_gpu_window_dry_run_exercises_every_step(tmp_path, digits_cache):
    pacs = tmp_path / "PACS"
    _pacs_tree(pacs)
    env = {**os.environ, "PYTHON": sys.executable, "FEDSHIFT_CACHE": digits_cache}
    env.pop("FEDSHIFT_REAL_DATA", None)
    out = tmp_path / "window"
    done = subprocess.run(
        ["bash", str(SCRIPT), str(out), "--dry-run", "--pacs", str(pacs)],
        env=env,
        capture_output=True,
        text=True,
        timeout=3700,  # the dry run gives each step 10x its GPU limit, 1 h in all
    )
    assert done.returncode == 0, done.stderr[-2000:]
    table = (out / "gpu_window.md").read_text()
    assert "dry run on the CPU" in table
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.count("|") >= 5}
    for name in STEPS:
        assert name in rows, (name, table)
        assert rows[name].split("|")[2].strip() == "ok", (name, rows[name], table)
        assert (out / f"{name}.log").is_file()
    assert "target accuracy" in rows["pacs"]
    # the PACS table's step: 2 methods x 1 target x seed 0 at tiny sizes, packed to travel
    assert "PACS table: seed 0: 2/2 cells done, 2 finished in this call" in rows["pacs-table"]
    state = out / "pacs-table.tgz"
    with tarfile.open(state) as tar:
        names = set(tar.getnames())
    for run in ("fedavg-sketch-s0", "centralized-sketch-s0"):
        assert f"{run}/summary.json" in names and f"{run}/.fedshift-run" in names
        assert f"{run}/checkpoint.pt" not in names  # finished: its checkpoint stays behind
    assert "table.md" in names
    # a later window given that state reads both cells back and records none twice
    again = tmp_path / "window2"
    done = subprocess.run(
        ["bash", str(SCRIPT), str(again), "--dry-run", "--pacs", str(pacs)]
        + ["--steps", "pacs-table", "--table-state", str(state)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    second = (again / "gpu_window.md").read_text()
    assert "PACS table: seed 0: 2/2 cells done, 0 finished in this call" in second, second
    rows = (again / "pacs-table" / "table.md").read_text().splitlines()[2:]
    assert sorted(row.split("|")[1].strip() for row in rows) == [
        "centralized-sketch-s0",
        "fedavg-sketch-s0",
    ]


def test_gpu_window_refuses_an_unknown_or_empty_step_list(tmp_path):
    for steps, message in (("pacs,bogus", "unknown step 'bogus'"), ("", "--steps is empty")):
        out = tmp_path / "window"
        done = subprocess.run(
            ["bash", str(SCRIPT), str(out), "--dry-run", "--steps", steps],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
        assert not out.exists()  # refused before anything ran or was written
