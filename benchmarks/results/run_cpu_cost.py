"""CPU cost per method of the runs under a sweep folder, from the ``cpu_seconds`` each round
records in metrics.jsonl: a Markdown table (mean and range per round, per run of ROUNDS).

    python benchmarks/results/run_cpu_cost.py SWEEP_DIR ROUNDS
"""

from __future__ import annotations

import collections
import json
import pathlib
import sys


def main() -> None:
    folder, rounds = pathlib.Path(sys.argv[1]), int(sys.argv[2])
    per_round = collections.defaultdict(list)
    for metrics in sorted(folder.glob("*/metrics.jsonl")):
        algorithm = json.loads((metrics.parent / "config.json").read_text())["algorithm"]
        for line in metrics.read_text().splitlines():
            row = json.loads(line)
            if "cpu_seconds" in row:
                per_round[algorithm].append(row["cpu_seconds"])
    print(
        f"| method | CPU s per round (mean, min-max) | CPU min per {rounds}-round run "
        "| rounds measured |"
    )
    print("|---|---|---|---|")
    for algorithm, seconds in per_round.items():
        mean = sum(seconds) / len(seconds)
        print(
            f"| {algorithm} | {mean:.1f} ({min(seconds):.1f}-{max(seconds):.1f}) "
            f"| {mean * rounds / 60:.1f} | {len(seconds)} |"
        )


if __name__ == "__main__":
    main()
