"""What the ``--resume`` data digest costs: SHA-256 over every decoded row of digits-dg (all
domains, every split), the pass each run start makes (``run_info.data_digests``).

    python benchmarks/speed/resume_digest_cost.py
"""

from __future__ import annotations

import time

import torch

from fedshift.data import load_dataset
from fedshift.engine.run.datadigest import data_digests

REPEATS = 5


def main() -> None:
    torch.set_num_threads(1)
    dataset = load_dataset("digits-dg")
    splits = [s for d in dataset.domains.values() for s in (d.train, d.val, d.test)]
    rows = sum(len(s) for s in splits)
    mib = sum(len(s.x) * s.x[0].numel() for s in splits) / 2**20
    timings = []
    for _ in range(REPEATS):
        wall, cpu = time.perf_counter(), time.process_time()
        data_digests(dataset)
        timings.append((time.perf_counter() - wall, time.process_time() - cpu))
    shown = " ".join(f"{w:.3f}/{c:.3f}" for w, c in timings)
    print(
        f"digits-dg: {len(dataset.domains)} domains, {rows} rows, {mib:.1f} MiB of pixels; "
        f"digest wall/CPU s: {shown} (torch CPU: {torch.backends.cpu.get_cpu_capability()})"
    )


if __name__ == "__main__":
    main()
