"""Seconds per round on the CPU vs a CUDA GPU, per algorithm, on digits-dg leave-one-domain-out
(target mnistm, the setting of the README's lodo table), measured in one run.

    python benchmarks/speed/device_speed.py [--algorithms fedavg,feddg-elcfs] [--rounds 3]
                                      [--threads N] [--devices cpu,cuda]

Round 1 is a warm-up (cuDNN picks its kernels, caches fill): the figure is the median of
the later rounds' ``seconds`` in metrics.jsonl, each including local training, aggregation
and the evaluation on every domain, but not the checkpoint written after the round (see
``benchmarks/speed/throughput.py`` for the training round alone, side by side with a bare loop).
The GPU's peak memory is printed next to it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from fedshift.config import resolve
from fedshift.engine.assembly import prepare
from fedshift.engine.run.runner import Runner

DEFAULT_ALGORITHMS = "fedavg,fedsr,fedga,ditto,fedadg,ccst,feddg-elcfs"


def seconds_per_round(algorithm: str, device: str, rounds: int, threads: int, dataset) -> float:
    settings = [f"device={device}", f"threads={threads}"]
    cfg = resolve(None, {"algorithm": algorithm, "target": "mnistm", "rounds": rounds}, settings)
    exp = prepare(cfg, dataset=dataset)
    with tempfile.TemporaryDirectory() as tmp:
        Runner(exp, Path(tmp) / "run", progress=False).run()
        lines = (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()
    return statistics.median(json.loads(line)["seconds"] for line in lines[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--algorithms", default=DEFAULT_ALGORITHMS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--devices", default="cpu,cuda")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (round 1 is the warm-up)")
    devices = args.devices.split(",")
    if not devices or not set(devices) <= {"cpu", "cuda"}:
        parser.error(f"--devices takes cpu and/or cuda, comma-separated; got {args.devices!r}")
    if "cuda" in devices and not torch.cuda.is_available():
        parser.error("CUDA is not available here; use --devices cpu")

    from fedshift.data import load_dataset

    dataset = load_dataset("digits-dg")
    gpu = torch.cuda.get_device_name() if "cuda" in devices else "-"
    print(f"CPU threads {args.threads}; GPU {gpu}; torch {torch.__version__}")
    header = " | ".join(f"{d} s/round" for d in devices)
    print(f"| algorithm | {header} | cpu/cuda | GPU peak MiB |")
    print("|---|" + "---|" * (len(devices) + 2))
    for algorithm in args.algorithms.split(","):
        times, peak = {}, "-"
        for device in devices:
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            times[device] = seconds_per_round(algorithm, device, args.rounds, args.threads, dataset)
            if device == "cuda":
                peak = f"{torch.cuda.max_memory_allocated() / 2**20:.0f}"
        ratio = f"{times['cpu'] / times['cuda']:.1f}" if {"cpu", "cuda"} <= times.keys() else "-"
        cells = " | ".join(f"{times[d]:.2f}" for d in devices)
        print(f"| {algorithm} | {cells} | {ratio} | {peak} |", flush=True)


if __name__ == "__main__":
    main()
