"""The ways (classes per client) and shots FedProto's official code draws for its MNIST runs,
beside those of finished fedshift ``fedproto-mnist`` runs: is the draw the gap to the paper?

    python benchmarks/fidelity/fedproto_official_draw.py [--seed 1234] [RUN_DIR ...]

The official ``exps/federated_main.py`` (yuetan031/FedProto) seeds numpy and ``random`` with
``--seed`` (default 1234), then draws ``n_list = np.random.randint(max(2, ways - stdev),
min(num_classes, ways + stdev + 1), num_users)`` and, for MNIST, ``k_list =
np.random.randint(shots - stdev + 1, shots + stdev - 1, num_users)`` before anything else
touches numpy's generator; this script repeats those two draws (20 clients, 100 shots,
stdev 2, as the README's command) for n = 3, 4, 5. Each fedshift run's ways are read from
its ``checkpoint.pt`` (every client's class list).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from fedproto_official import official_lists

from fedshift.config import rebuild_config
from fedshift.core.errors import FedshiftError
from fedshift.core.runfiles import RunFiles
from fedshift.core.state import load_checkpoint


def official_draw(ways: int, seed: int) -> tuple[list[int], list[int]]:
    """The official n_list and k_list (MNIST rule) for ``ways`` under ``seed``, sorted."""
    n_list, k_list = official_lists(ways, seed)
    return sorted(n_list.tolist()), sorted(k_list.tolist())


def run_ways(run_dir: Path) -> tuple[int, list[int]]:
    """The run's ``ways`` setting and its clients' class counts."""
    checkpoint = load_checkpoint(RunFiles(run_dir).checkpoint)
    counts = sorted(len(client["classes"]) for client in checkpoint["clients"].values())
    return int(rebuild_config(run_dir).ways), counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, metavar="RUN_DIR")
    parser.add_argument("--seed", type=int, default=1234, help="the official --seed")
    args = parser.parse_args()
    for run in args.runs:
        if not RunFiles(run).checkpoint.is_file():
            print(f"error: {run} holds no checkpoint.pt (not a finished run)", file=sys.stderr)
            sys.exit(2)
    try:  # every run is read before the table starts: a bad one prints no partial table
        run_draws = [(run, *run_ways(run)) for run in args.runs]
    except FedshiftError as err:  # a corrupt checkpoint, a config that no longer resolves
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print("| draw | n | mean ways per client | ways per client (sorted) | shots |")
    print("|---|---|---|---|---|")
    for ways in (3, 4, 5):
        n_list, k_list = official_draw(ways, args.seed)
        print(
            f"| official, seed {args.seed} | {ways} | {np.mean(n_list):.2f} | "
            f"{' '.join(map(str, n_list))} | {min(k_list)}-{max(k_list)} |"
        )
    for run, ways, counts in run_draws:
        print(f"| {run.name} | {ways} | {np.mean(counts):.2f} | {' '.join(map(str, counts))} | |")


if __name__ == "__main__":
    main()
