"""FedProto's published figure recomputed from a finished fedshift run the way the official
code computes it, beside fedshift's per-client figure: both from the same final models.

    python benchmarks/fidelity/fedproto_official_eval.py RUN_DIR [RUN_DIR ...]

The official ``test_inference_new_het_lt`` (yuetan031/FedProto, ``lib/update.py``) scores
each client twice, with its own head over all classes and with the nearest global prototype
among its own classes, but never resets ``correct`` and ``total``: the accuracy it appends
for client i is the running ratio over clients 0..i, both passes pooled. The paper's
"97.13 ± 0.30" is the mean and population std of those running ratios. fedshift reports
the mean and sample std over clients of each client's own prototype accuracy. This script
rebuilds the run's partition from its saved config, loads each client's final model and the
server's final prototypes from ``checkpoint.pt``, and prints both.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
from fedproto_official import official_running_ratios, score_clients

from fedshift.config import rebuild_config
from fedshift.core.errors import FedshiftError
from fedshift.core.runfiles import RunFiles
from fedshift.core.state import load_checkpoint
from fedshift.data import load_dataset
from fedshift.scenarios.scenario import partition_sources


def client_counts(run_dir: Path) -> list[tuple[int, int, int]]:
    """(head correct, prototype correct, test images) per client, in client order."""
    checkpoint = load_checkpoint(RunFiles(run_dir).checkpoint)  # first: a bad one fails fast
    cfg = rebuild_config(run_dir)
    torch.set_num_threads(1)
    dataset = load_dataset(
        cfg.dataset,
        data_root=cfg.data_root,
        image_size=cfg.image_size or None,
        seed=cfg.split_seed,
        catalog_split=cfg.catalog_split,
    )
    domain = dataset.domain_names[0]
    test = dataset.domain(domain).test
    specs = partition_sources(cfg, dataset, [domain])
    clients = [
        (
            spec.client_id,
            test.x[torch.from_numpy(spec.test_idx)],
            test.y[torch.from_numpy(spec.test_idx)],
        )
        for spec in specs
    ]
    gray = cfg.input_channels == 1
    return score_clients(checkpoint, (cfg.model, cfg.normalize, gray), dataset.num_classes, clients)


def main() -> None:
    parser = argparse.ArgumentParser(
        description="FedProto's published figure (the official running-ratio formula) beside "
        "fedshift's per-client figure, from finished fedproto-mnist runs."
    )
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_DIR")
    args = parser.parse_args()
    for run in args.runs:
        if not RunFiles(run).checkpoint.is_file():
            print(f"error: {run} holds no checkpoint.pt (not a finished run)", file=sys.stderr)
            sys.exit(2)
    try:  # every run is read before the table starts: a bad one prints no partial table
        all_counts = [client_counts(run) for run in args.runs]
    except FedshiftError as err:  # a corrupt checkpoint, a config that no longer resolves
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(
        "| run | fedshift: mean ± std over clients (prototype rule) | official formula: "
        "mean ± std of running ratios | head alone |"
    )
    print("|---|---|---|---|")
    by_ways: dict[str, list[tuple[float, float, float]]] = {}
    for run, counts in zip(args.runs, all_counts, strict=True):
        own = [100 * g / t for _, g, t in counts]
        running = official_running_ratios(counts)
        head_only = 100 * sum(h for h, _, _ in counts) / sum(t for _, _, t in counts)
        print(
            f"| {run.name} | {statistics.mean(own):.2f} ± {statistics.stdev(own):.2f} "
            f"| {np.mean(running):.2f} ± {np.std(running):.2f} | {head_only:.2f} |"
        )
        named = re.fullmatch(r"n(\d+)-s\d+", run.name)  # the runs of fedproto_mnist.sh
        if named:
            by_ways.setdefault(named[1], []).append(
                (statistics.mean(own), float(np.mean(running)), head_only)
            )
    for ways, rows in by_ways.items():  # mean ± std over seeds, where a ways has several
        if len(rows) < 2:
            continue
        own, running, heads = (list(column) for column in zip(*rows, strict=True))
        print(
            f"| **n = {ways}, {len(rows)} seeds** (mean ± std over seeds) "
            f"| {statistics.mean(own):.2f} ± {statistics.stdev(own):.2f} "
            f"| **{statistics.mean(running):.2f} ± {statistics.stdev(running):.2f}** "
            f"| {statistics.mean(heads):.2f} |"
        )


if __name__ == "__main__":
    main()
