"""benchmarks/fidelity/fedproto_official_run.py: stages MNIST where torchvision reads it, runs
the checkout's ``exps/federated_main.py`` with the README's flags and records the final figures
it prints; a folder that is not a checkout, bad seeds, missing files are one-line exit-2 errors.
The released code itself is not here: a stand-in prints its two final lines."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = (
    Path(__file__).resolve().parents[2] / "benchmarks" / "fidelity" / "fedproto_official_run.py"
)
FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
         "t10k-labels-idx1-ubyte")  # fmt: skip
STAND_IN = """
import pathlib, sys
args = sys.argv[1:]
value = dict(zip(args[::2], args[1::2]))
raw = pathlib.Path(value["--data_dir"]) / "mnist" / "MNIST" / "raw"
assert sorted(p.name for p in raw.iterdir()) == sorted(%r), list(raw.iterdir())
assert value["--ways"] == "4" and value["--num_users"] == "20" and value["--shots"] == "100"
print("For all users (with protos), mean of test acc is 0.9%s000, std of test acc is 0.00250")
print("For all users (w/o protos), mean of test acc is 0.97000, std of test acc is 0.00500")
"""


def run(*argv) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, argv)], capture_output=True,
                          text=True, timeout=120)  # fmt: skip


def test_the_printed_final_figures_are_recorded_per_seed(tmp_path):
    checkout = tmp_path / "FedProto"
    (checkout / "exps").mkdir(parents=True)
    (checkout / "exps" / "federated_main.py").write_text(STAND_IN % (list(FILES), "8"))
    digit_five = tmp_path / "digit-five"
    (digit_five / "mnist").mkdir(parents=True)
    for name in FILES:
        with gzip.open(digit_five / "mnist" / f"{name}.gz", "wb") as sink:
            sink.write(b"idx")
    out = tmp_path / "out"
    done = run(checkout, digit_five, out, "--ways", 4, "--seeds", "0,1", "--rounds", 2)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (out / "official.jsonl").read_text().splitlines()]
    assert [(r["seed"], r["ways"], r["rounds"]) for r in rows] == [(0, 4, 2), (1, 4, 2)]
    assert rows[0]["with_protos_mean"] == 0.98 and rows[0]["with_protos_std"] == 0.0025
    assert rows[0]["without_protos_mean"] == 0.97
    assert (out / "data" / "mnist" / "MNIST" / "raw" / FILES[0]).read_bytes() == b"idx"
    assert "n = 4, seed 1: with protos 98.00 ± 0.25" in done.stdout
    table = (out / "official.md").read_text()
    assert "| 4 | 2 | 0 | 98.00 ± 0.25 | 97.00 |" in table
    assert "| **4** | 2 | 2 seeds | **98.00 ± 0.00** (over seeds) | | |" in table


def test_a_hand_run_log_is_recorded_with_its_gnu_time_line(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "n3-s5.log").write_text(
        "For all users (with protos), mean of test acc is 0.97950, std of test acc is 0.00519\n"
        "For all users (w/o protos), mean of test acc is 0.97984, std of test acc is 0.00542\n"
        "cpu_user=820.73 cpu_sys=2.22 wall=1184.65\n"
    )
    (out / "n3-s6.log").write_text("| Global Training Round : 40 |\n")  # stopped early
    checkout = tmp_path / "FedProto"
    (checkout / "exps").mkdir(parents=True)
    (checkout / "exps" / "federated_main.py").write_text("raise SystemExit('must not run')")
    done = run(checkout, tmp_path / "no-mnist-needed", out, "--seeds", 5, "--logs")
    assert done.returncode == 0, done.stderr
    (row,) = [json.loads(line) for line in (out / "official.jsonl").read_text().splitlines()]
    assert (row["seed"], row["with_protos_mean"], row["cpu_seconds"]) == (5, 0.9795, 823.0)
    done = run(checkout, tmp_path, out, "--seeds", 6, "--logs")
    assert done.returncode == 2 and "holds no final figures" in done.stderr


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for argv, message in (
        ([tmp_path, tmp_path, tmp_path / "o"], "is not a FedProto checkout"),
        ([tmp_path, tmp_path, tmp_path / "o", "--seeds", "0,x"], None),
    ):
        if message is None:
            (tmp_path / "exps").mkdir(exist_ok=True)
            (tmp_path / "exps" / "federated_main.py").write_text("")
            message = "is not a list of integers"
        done = run(*argv)
        assert done.returncode == 2 and message in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    done = run(tmp_path, tmp_path / "nowhere", tmp_path / "o")
    assert done.returncode == 2 and "is missing" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
