"""The prepared GPU command runs every step on the CPU with ``--dry-run``, so a short GPU
window never meets an untested step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_catalog_loaders import _pacs_tree

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "gpu_window.sh"
STEPS = ("gpu-tests", "throughput", "vmap", "resnet", "input", "pacs", "uda")


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
