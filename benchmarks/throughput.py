"""FedAvg throughput side by side, in one process: samples/s and rounds/s of the same round
(every client: E local epochs of SGD on its share, then the weighted mean) on the digit CNN
(``cnn``), digits-dg re-partitioned into N clients (sources mnist and syn, N/2 IID clients
each), for

    sequential   fedshift's simulation engine, clients one after another (the CPU default)
    vectorized   fedshift's simulation engine with ``vectorize=on`` (vmap over stacked clients)
    fused        one model trained on the fused batch of all clients, same steps: the ceiling
    bare         a bare sequential PyTorch loop: its own minimal data path (float tensors
                 prepared once), one module reset to the global weights per client
    flower-sim   Flower's simulation engine (flwr[simulation], Ray) running the same model,
                 data and local work (only with ``--flower``, when flwr[simulation] imports;
                 its rounds run in one ``run_simulation`` call after the others, so they are
                 not interleaved: benchmarks/flower_simulation.py)

Each repetition times one round of every method in turn (interleaved, after a warm-up
round each), so machine load hits them alike; the table shows min and median over
repetitions and the ratios of medians.

    python benchmarks/throughput.py [--clients 10,100,400] [--repeats 5] [--threads 1]
                                    [--device cpu] [--flower] [--quick]

``--quick`` (CI smoke): 4 clients on a tenth of the data, 2 repetitions, seconds.
Loopback Flower (SuperLink + SuperNodes) is measured by ``benchmarks/flower_overhead.sh``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fedshift.algorithms.toolkit import state_dict_cpu
from fedshift.config import resolve
from fedshift.core.reduce import weighted_mean
from fedshift.core.split import dense, to_input
from fedshift.engine.assembly import Experiment, prepare
from fedshift.engine.simulation.dispatch import SimulationFederation

METHODS = ("sequential", "vectorized", "fused", "bare")


@dataclass
class Setting:
    clients: int
    data_fraction: float
    local_epochs: int
    batch_size: int
    device: str
    threads: int


def experiment(setting: Setting, dataset=None) -> Experiment:
    flags = {
        "algorithm": "fedavg",
        "target": "mnistm",
        "sources": "mnist,syn",
        "clients_per_domain": max(1, setting.clients // 2),
        "local_epochs": setting.local_epochs,
        "batch_size": setting.batch_size,
        "model": "cnn",
    }
    sets = [
        f"device={setting.device}",
        f"threads={setting.threads}",
        f"client_data_fraction={setting.data_fraction}",
    ]
    return prepare(resolve(None, flags, sets), dataset=dataset)


class FedshiftRound:
    """One FedAvg round through fedshift's simulation engine."""

    def __init__(self, exp: Experiment, vectorize: bool):
        self.fed = SimulationFederation.for_experiment(exp)
        self.fed.vectorize = vectorize
        self.algorithm = exp.algorithm
        self.state = exp.algorithm.init_state()
        self.round = 0

    def __call__(self) -> int:
        self.round += 1
        self.fed.begin_round(self.round)
        before = self.fed.samples
        self.state, _ = self.algorithm.round(self.state, self.fed)
        return self.fed.samples - before


class BareData:
    """Each source client's training split as float tensors on the device, prepared once."""

    def __init__(self, exp: Experiment):
        self.device = exp.device
        self.clients = [
            (to_input(dense(ctx.train.x), exp.device), ctx.train.y.to(exp.device))
            for ctx in exp.contexts.values()
            if ctx.role == "source"
        ]
        self.model = exp.algorithm.run.build_model().to(exp.device)
        self.cfg = exp.algorithm.run.train_cfg
        self.weights = state_dict_cpu(self.model)
        self.generator = torch.Generator().manual_seed(0)

    def optimizer(self, params):
        cfg = self.cfg
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )

    def batches(self, n: int):
        order = torch.randperm(n, generator=self.generator).to(self.device)
        size = self.cfg.batch_size
        return [order[i : i + size] for i in range(0, n, size) if min(size, n - i) >= 2]


class BareRound(BareData):
    """A bare sequential PyTorch FedAvg round: one module reset per client, weighted mean."""

    def __call__(self) -> int:
        model, seen, states, sizes = self.model, 0, [], []
        for x, y in self.clients:
            model.load_state_dict(self.weights)
            model.train()
            opt = self.optimizer(model.parameters())
            for _ in range(self.cfg.local_epochs):
                for idx in self.batches(len(x)):
                    loss = F.cross_entropy(model(x[idx]), y[idx])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    seen += len(idx)
            states.append(state_dict_cpu(model))
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


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(
    rounds: dict[str, Callable[[], int]], repeats: int, device: torch.device
) -> dict[str, list[tuple[float, int]]]:
    """Interleaved: per repetition one round of each method in turn; (seconds, samples)."""
    for run_round in rounds.values():  # warm-up: kernels, caches, lazy imports
        run_round()
    timings: dict[str, list[tuple[float, int]]] = {name: [] for name in rounds}
    for _ in range(repeats):
        for name, run_round in rounds.items():
            sync(device)
            start = time.perf_counter()
            samples = run_round()
            sync(device)
            timings[name].append((time.perf_counter() - start, samples))
    return timings


def flower_timings(exp: Experiment, setting: Setting, repeats: int, workers: int):
    """Flower's simulation engine (Ray) on the same model, data and local work: its rounds
    timed one after another inside its ServerApp; None when flwr[simulation] is missing."""
    try:
        from flower_simulation import flower_simulation_rounds
    except ImportError as exc:
        print(f"flower-sim: not measured ({exc})")
        return None
    return flower_simulation_rounds(exp, setting, repeats, workers)


def table(clients: int, timings: dict[str, list[tuple[float, int]]]) -> list[str]:
    lines = []
    medians = {}
    for name, rows in timings.items():
        rates = [samples / seconds for seconds, samples in rows]
        per_round = [1 / seconds for seconds, _ in rows]
        medians[name] = statistics.median(rates)
        lines.append(
            f"| {clients} | {name} | {min(rates):,.0f} | {statistics.median(rates):,.0f} | "
            f"{min(per_round):.3f} | {statistics.median(per_round):.3f} |"
        )
    ratios = []
    pairs = [
        ("vectorized", "sequential"),
        ("sequential", "bare"),
        ("vectorized", "fused"),
        ("sequential", "flower-sim"),
        ("vectorized", "flower-sim"),
    ]
    for a, b in pairs:
        if a in medians and b in medians:
            ratios.append(f"{a}/{b} {medians[a] / medians[b]:.2f}")
    lines.append(f"|  | ratios of median samples/s: {', '.join(ratios)} | | | | |")
    return lines


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="10,100,400")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--data-fraction", type=float, default=1.0)
    parser.add_argument("--flower", action="store_true", help="also Flower's simulation engine")
    parser.add_argument(
        "--flower-workers",
        type=int,
        default=1,
        help="ClientApps Flower runs at once (default 1, like fedshift's one process)",
    )
    parser.add_argument("--quick", action="store_true", help="4 clients, 1/10 data, 2 repeats")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.repeats = "4", min(args.repeats, 2)
        args.data_fraction = min(args.data_fraction, 0.1)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("CUDA is not available here; use --device cpu")
    counts = [int(c) for c in args.clients.split(",")]
    if any(c < 2 or c % 2 for c in counts):
        parser.error("--clients takes even numbers >= 2 (N/2 clients on each of two domains)")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    name = (
        torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {args.threads} thread(s)"
    )
    lines = [
        f"FedAvg, digit CNN, digits-dg (mnist+syn re-partitioned), batch {args.batch_size}, "
        f"E={args.local_epochs}, data fraction {args.data_fraction}; {name}; torch "
        f"{torch.__version__}; {args.repeats} interleaved repetitions",
        "",
        "| clients | method | samples/s min | samples/s median | rounds/s min | rounds/s median |",
        "|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    dataset = None
    for clients in counts:
        setting = Setting(
            clients,
            args.data_fraction,
            args.local_epochs,
            args.batch_size,
            args.device,
            args.threads,
        )
        exp = experiment(setting, dataset)
        dataset = exp.dataset
        rounds: dict[str, Callable[[], int]] = {
            "sequential": FedshiftRound(exp, vectorize=False),
            "vectorized": FedshiftRound(experiment(setting, dataset), vectorize=True),
            "fused": FusedRound(exp),
            "bare": BareRound(exp),
        }
        timings = measure(rounds, args.repeats, device)
        if args.flower:
            flower = flower_timings(exp, setting, args.repeats, args.flower_workers)
            if flower is not None:
                timings["flower-sim"] = flower
        rows = table(clients, timings)
        print("\n".join(rows), flush=True)
        lines.extend(rows)
    return lines


if __name__ == "__main__":
    main()
