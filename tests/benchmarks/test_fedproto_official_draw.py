"""benchmarks/fidelity/fedproto_official_draw.py: the official FedProto MNIST draw of ways
and shots."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = (
    Path(__file__).resolve().parents[2] / "benchmarks" / "fidelity" / "fedproto_official_draw.py"
)


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False
    )


def test_the_official_seed_draws_these_ways_and_shots():
    # numpy's RandomState stream is frozen: np.random.seed(1234); randint(2, 6, 20) then
    # randint(99, 101, 20), as the official federated_main.py draws for n = 3 on MNIST
    done = run()
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| official")]
    assert rows[0] == (
        "| official, seed 1234 | 3 | 3.55 | 2 2 2 2 2 3 3 3 3 4 4 4 4 4 4 5 5 5 5 5 | 99-100 |"
    )
    assert [row.split(" | ")[1] for row in rows] == ["3", "4", "5"]


def test_a_folder_without_a_finished_run_is_one_line_and_exit_2(tmp_path):
    done = run(str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: {tmp_path} holds no checkpoint.pt (not a finished run)"
