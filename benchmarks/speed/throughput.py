"""FedAvg throughput side by side, in one process: samples/s and rounds/s of the same round
(every client: E local epochs of SGD on its share, then the weighted mean) on the digit CNN
(``cnn``), digits-dg re-partitioned into N clients of a fixed number of samples each (sources
mnist and syn, N/2 IID clients each; ``fedavg_bench.py``), for

    sequential   fedshift's simulation engine, clients one after another (the CPU default)
    vectorized   fedshift's simulation engine with ``vectorize=on`` (vmap over stacked clients)
    fused        one model trained on the fused batch of all clients, same steps: the ceiling
    bare         a bare sequential PyTorch loop: its own minimal data path (float tensors
                 prepared once), one module reset to the global weights per client
    flower-sim   Flower's simulation engine (flwr[simulation], Ray) running the same model,
                 data and local work (only with ``--flower``: ``flower_simulation.py`` in a
                 child process after the others, so its rounds are not paired)

After a warm-up round of each method, each repetition runs one round of every method back to
back (the order reversed every other repetition), so load on the machine hits a pair alike.
The tables give samples/s and rounds/s (min, median) per method and, per pair of methods, the
median and min–max of the per-repetition ratios of samples/s.

    python benchmarks/speed/throughput.py [--clients 10,100,400] [--samples-per-client 128]
                                    [--repeats 5] [--methods sequential,bare] [--threads 1]
                                    [--device cpu] [--flower] [--quick]

``--quick`` (CI smoke): 4 clients of 32 samples, 2 repetitions, seconds.
Loopback Flower (SuperLink + SuperNodes) is measured by ``benchmarks/speed/flower_overhead.sh``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from fedavg_bench import BareData, FedshiftRound, Setting, digits, experiment, timed

from fedshift.algorithms.toolkit import state_dict_cpu
from fedshift.core.reduce import weighted_mean
from fedshift.data import DomainDataset
from fedshift.engine.assembly import Experiment

METHODS = ("sequential", "bare", "vectorized", "fused")
#: (numerator, denominator) of the paired ratios, when both were measured.
PAIRS = (
    ("sequential", "bare"),
    ("vectorized", "sequential"),
    ("vectorized", "fused"),
)
FLOWER_SCRIPT = Path(__file__).resolve().parent / "flower_simulation.py"


class BareRound(BareData):
    """A bare sequential PyTorch FedAvg round: one module reset per client, weighted mean."""

    def __call__(self) -> int:
        seen, states, sizes = 0, [], []
        for x, y in self.clients:
            seen += self.local_sgd(self.weights, x, y)
            states.append(state_dict_cpu(self.model))
            sizes.append(len(x))
        self.weights = weighted_mean(states, sizes)
        return seen


class FusedRound(BareData):
    """The ceiling: one model, each step on the concatenation of all clients' batches."""

    def __init__(self, exp: Experiment):
        super().__init__(exp)
        self.opt = self.optimizer(self.model.parameters())

    def __call__(self) -> int:
        seen = 0
        self.model.train()
        for _ in range(self.cfg.local_epochs):
            plans = [self.batches(len(x)) for x, _ in self.clients]
            for step in range(max(len(p) for p in plans)):
                parts = [
                    (x[p[step]], y[p[step]])
                    for (x, y), p in zip(self.clients, plans, strict=True)
                    if step < len(p)
                ]
                xs = torch.cat([a for a, _ in parts])
                ys = torch.cat([b for _, b in parts])
                loss = F.cross_entropy(self.model(xs), ys)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                self.opt.step()
                seen += len(xs)
        return seen


def measure(
    rounds: dict[str, Callable[[], int]], repeats: int, device: torch.device
) -> dict[str, list[tuple[float, int]]]:
    """(seconds, samples) of each method's rounds; after one warm-up round each, every
    repetition runs one round of each method back to back, the order reversed every other
    repetition so that neither side of a pair always goes first."""
    for run_round in rounds.values():  # warm-up: kernels, caches, lazy imports
        run_round()
    timings: dict[str, list[tuple[float, int]]] = {name: [] for name in rounds}
    names = list(rounds)
    for repetition in range(repeats):
        for name in names if repetition % 2 == 0 else reversed(names):
            timings[name].append(timed(rounds[name], device))
    return timings


def flower_timings(setting: Setting, repeats: int, workers: int):
    """Flower's simulation engine (Ray) on the same model, data and local work, run by
    ``flower_simulation.py`` in a child process; None when it cannot run here."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "flower.json"
        command = [sys.executable, str(FLOWER_SCRIPT), "--timings", str(out)]
        command += ["--clients", str(setting.clients), "--repeats", str(repeats)]
        command += ["--samples-per-client", str(setting.samples_per_client)]
        command += ["--local-epochs", str(setting.local_epochs)]
        command += ["--batch-size", str(setting.batch_size), "--device", setting.device]
        command += ["--threads", str(setting.threads), "--workers", str(workers)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"flower-sim: not measured ({last})")
            return None
        return [tuple(row) for row in json.loads(out.read_text())]


def rates(rows: list[tuple[float, int]]) -> list[float]:
    return [samples / seconds for seconds, samples in rows]


def method_rows(clients: int, timings: dict[str, list[tuple[float, int]]]) -> list[str]:
    lines = []
    for name, rows in timings.items():
        per_second = rates(rows)
        per_round = [1 / seconds for seconds, _ in rows]
        lines.append(
            f"| {clients} | {name} | {min(per_second):,.0f} | {statistics.median(per_second):,.0f}"
            f" | {min(per_round):.3f} | {statistics.median(per_round):.3f} |"
        )
    return lines


def ratio_rows(clients: int, timings: dict[str, list[tuple[float, int]]]) -> list[str]:
    """Per pair: the median and min–max of the per-repetition ratios of samples/s; Flower's
    rounds are not paired, so against it the ratio of the medians."""
    lines = []
    for a, b in PAIRS:
        if a in timings and b in timings:
            ratios = [x / y for x, y in zip(rates(timings[a]), rates(timings[b]), strict=True)]
            lines.append(
                f"| {clients} | {a} / {b} | {statistics.median(ratios):.2f} | "
                f"{min(ratios):.2f}–{max(ratios):.2f} | {len(ratios)} |"
            )
    if "flower-sim" in timings:
        flower = statistics.median(rates(timings["flower-sim"]))
        for name in ("sequential", "vectorized"):
            if name in timings:
                ratio = statistics.median(rates(timings[name])) / flower
                lines.append(f"| {clients} | {name} / flower-sim | {ratio:.2f} | not paired | |")
    return lines


def method_round(
    method: str, exp: Experiment, setting: Setting, dataset: DomainDataset
) -> Callable[[], int]:
    """One round of ``method`` as a call returning the samples it trained on; the vectorized
    engine gets its own experiment (its clients' state is separate from sequential's)."""
    if method == "sequential":
        return FedshiftRound(exp, vectorize=False)
    if method == "vectorized":
        return FedshiftRound(experiment(setting, dataset), vectorize=True)
    if method == "fused":
        return FusedRound(exp)
    return BareRound(exp)


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="10,100,400")
    parser.add_argument(
        "--samples-per-client",
        type=int,
        default=128,
        help="training samples of every client at every client count (default 128: 4 batches)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"comma-separated, of {', '.join(METHODS)} (default all)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--flower", action="store_true", help="also Flower's simulation engine")
    parser.add_argument(
        "--flower-workers",
        type=int,
        default=1,
        help="ClientApps Flower runs at once (default 1, like fedshift's one process)",
    )
    parser.add_argument("--quick", action="store_true", help="4 clients of 32 samples, 2 repeats")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.repeats = "4", min(args.repeats, 2)
        args.samples_per_client = min(args.samples_per_client, 32)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("CUDA is not available here; use --device cpu")
    counts = [int(c) for c in args.clients.split(",")]
    if any(c < 2 or c % 2 for c in counts):
        parser.error("--clients takes even numbers >= 2 (N/2 clients on each of two domains)")
    if args.samples_per_client < 2:
        parser.error("--samples-per-client takes at least 2 (one BatchNorm batch)")
    methods = args.methods.split(",")
    if unknown := sorted(set(methods) - set(METHODS)):
        parser.error(f"unknown --methods {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    name = (
        torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {args.threads} thread(s)"
    )
    header = [
        f"FedAvg, digit CNN, digits-dg (mnist+syn re-partitioned), {args.samples_per_client} "
        f"samples per client, batch {args.batch_size}, E={args.local_epochs}; {name}; torch "
        f"{torch.__version__}; warm-up + {args.repeats} repetitions, each method back to back",
    ]
    print("\n".join(header), flush=True)
    per_method = [
        "| clients | method | samples/s min | samples/s median | rounds/s min | rounds/s median |",
        "|---|---|---|---|---|---|",
    ]
    paired = [
        "| clients | samples/s ratio | median of paired ratios | min–max | pairs |",
        "|---|---|---|---|---|",
    ]
    dataset = None
    for clients in counts:
        setting = Setting(
            clients,
            args.samples_per_client,
            args.local_epochs,
            args.batch_size,
            args.device,
            args.threads,
        )
        dataset = digits(setting) if dataset is None else dataset
        exp = experiment(setting, dataset)
        rounds = {method: method_round(method, exp, setting, dataset) for method in methods}
        timings = measure(rounds, args.repeats, device)
        if args.flower:
            flower = flower_timings(setting, args.repeats, args.flower_workers)
            if flower is not None:
                timings["flower-sim"] = flower
        rows, ratios = method_rows(clients, timings), ratio_rows(clients, timings)
        print("\n".join(rows + ratios), flush=True)
        per_method += rows
        paired += ratios
    tables = header + ["", *per_method, "", *paired]
    print("\n" + "\n".join(tables[1:]), flush=True)
    return tables


if __name__ == "__main__":
    main()
