"""What each experiment logger (run key ``tracking``) costs a run: the time it takes to start,
to log one round (every number of the round's metrics line), and to log the summary and
close, measured inside the run next to the round's own wall time.

A tiny FedAvg run on digits-dg (a share of each client's data, one CPU thread) per logger:

    python benchmarks/speed/tracking_overhead.py [--rounds 10] [--fraction 0.05] [--threads 1]
                                           [--loggers tensorboard,wandb,mlflow]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from fedshift.config import resolve
from fedshift.engine.assembly import prepare
from fedshift.engine.run.runner import Runner


def measure(name: str, args: argparse.Namespace, root: Path) -> dict[str, float]:
    sets = [
        f"rounds={args.rounds}",
        f"client_data_fraction={args.fraction}",
        f"threads={args.threads}",
        "device=cpu",
        f"tracking={name}",
    ]
    runner = Runner(prepare(resolve(None, {}, sets)), root / name, progress=False)
    runner.run()
    spent = runner.tracking.seconds
    lines = (root / name / "metrics.jsonl").read_text().splitlines()
    return {
        "start_s": spent["start"].get(name, 0.0),
        "per_round_ms": 1000 * spent.get("log a round", {}).get(name, 0.0) / args.rounds,
        "finish_s": spent.get("log the summary", {}).get(name, 0.0)
        + spent.get("close", {}).get(name, 0.0),
        "round_s": statistics.median(float(line.split('"seconds": ')[1][:-1]) for line in lines),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--fraction", type=float, default=0.05)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--loggers", default="tensorboard,wandb,mlflow")
    args = parser.parse_args()
    print("| logger | start (s) | per round (ms) | summary + close (s) | round wall (s, median) |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.loggers.split(","):
            row = measure(name, args, Path(tmp))
            print(
                f"| {name} | {row['start_s']:.2f} | {row['per_round_ms']:.1f} | "
                f"{row['finish_s']:.2f} | {row['round_s']:.2f} |"
            )


if __name__ == "__main__":
    main()
