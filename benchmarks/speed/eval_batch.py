"""Evaluation throughput and peak memory by batch size, on this CPU (or a CUDA device).

Scores random images with the digit CNN at 32 px and ResNet-18 at 224 px in eval mode,
in batches of 32, 64, 256 and 1000, one process: samples/s (best of ``--repeats``) and the
process's peak resident memory after each size (batch sizes ascend, so each peak is the
largest batch so far's). A batch larger than ``--samples`` is skipped (a loaded machine may
need fewer samples). It is the measurement behind ``eval_batch_size=0`` (auto) in
``fedshift.engine.evaluation``; prints the load average, as the machine may be shared.

    python benchmarks/speed/eval_batch.py [--samples 1000] [--threads 0] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import resource
import time

import torch

from fedshift.models import build_model

CASES = (("cnn", 32, 10), ("resnet18", 224, 7))  # small first: peaks ascend
BATCHES = (32, 64, 256, 1000)


def peak_rss_gib() -> float:
    """The process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


@torch.no_grad()
def samples_per_second(model, images: torch.Tensor, batch: int, device, repeats: int) -> float:
    """Best of ``repeats`` passes over ``images`` in batches of ``batch``."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for start in range(0, len(images), batch):
            model(images[start : start + batch].to(device)).argmax(1)
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return len(images) / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="0: torch's default")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"load average {os.getloadavg()}; torch threads {torch.get_num_threads()}; {device}")
    print(f"{'model':10} {'px':>4} {'batch':>6} {'samples/s':>10} {'peak RSS GiB':>13}")
    for name, size, classes in CASES:
        model = build_model(name, classes, image_size=size).to(device).eval()
        images = torch.rand(args.samples, 3, size, size) * 2 - 1
        for batch in BATCHES:
            if batch > args.samples:
                print(f"{name:10} {size:>4} {batch:>6} {'skipped: over --samples':>24}")
                continue
            rate = samples_per_second(model, images, batch, device, args.repeats)
            print(f"{name:10} {size:>4} {batch:>6} {rate:>10.1f} {peak_rss_gib():>13.2f}")
    print(f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
