"""Seconds per round of a short main job by CPU-thread rule, idle and beside one busy process.

Runs ``fedshift run --rounds 2 --set client_data_fraction=0.2`` (FedAvg on digits-dg, target
mnistm, the CPU) with ``threads`` = torch's default (one per core) and ``threads=0`` (the
default: one thread), each idle and beside a Python busy loop, as interleaved repetitions
(every rule once per condition per repetition, so a change of the machine's load hits all
rules alike). Per case: the median over repetitions of the mean ``seconds`` of the rounds in
metrics.jsonl (training and evaluation, not loading), and the load average around it.

    python benchmarks/speed/threads_contention.py [--repeats 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

BUSY_LOOP = "while True: pass"


def seconds_per_round(threads: int, rounds: int, out: Path) -> float:
    """Mean round seconds of one ``fedshift run`` with ``threads``."""
    command = [
        sys.executable, "-m", "fedshift.cli", "run", "--rounds", str(rounds), "--device", "cpu",
        "--set", "client_data_fraction=0.2", "--set", "tracking=none",
        "--set", f"threads={threads}", "--out", str(out),
    ]  # fmt: skip
    subprocess.run(command, check=True, capture_output=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.mean(row["seconds"] for row in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    rules = {
        f"torch's default (threads={torch.get_num_threads()})": torch.get_num_threads(),
        "default (threads=0: one)": 0,
    }
    print(f"{cores} usable cores; load average at start {os.getloadavg()}")
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for condition in ("idle", "busy"):
                busy = None
                if condition == "busy":
                    busy = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
                try:
                    for rule, threads in rules.items():
                        out = Path(tmp) / f"{rep}-{condition}-{threads}"
                        s = seconds_per_round(threads, args.rounds, out)
                        times.setdefault((condition, rule), []).append(s)
                        load = os.getloadavg()[0]
                        line = f"rep {rep} {condition:4} {rule:22} {s:7.2f} s/round"
                        print(f"{line}  load {load:.2f}", flush=True)
                finally:
                    if busy is not None:
                        busy.kill()
                        busy.wait()
    print(f"\nmedian s/round over {args.repeats} repetitions (load at end {os.getloadavg()})")
    for (condition, rule), values in times.items():
        print(f"{condition:4} {rule:22} {statistics.median(values):7.2f}")


if __name__ == "__main__":
    main()
