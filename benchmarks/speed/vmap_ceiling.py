"""How close fedshift's vectorized clients come to a bare ``torch.func.vmap``, in one run.

Three ways to run the same FedAvg round (every client: E epochs of SGD with momentum and
weight decay on its own batches, then the mean of the clients' weights), on the digit CNN
(``cnn``) and digits-dg re-partitioned into N clients of a fixed number of samples each
(``fedavg_bench.py``), at the same shapes and on the same device:

    bare-vmap    no fedshift code in the step: N copies of the model's weights stacked, every
                 client's data resident in one stacked tensor, one ``vmap`` over
                 ``functional_call`` forward/backward per step and a functional SGD (momentum,
                 weight decay) updating the stacked weights in place: the ceiling
    vectorized   fedshift's simulation engine with ``vectorize=on``
    sequential   fedshift's simulation engine, clients one after another

After a warm-up round of each, every repetition runs one round of each method back to back
(the order reversed every other repetition), so load on the machine hits them alike. Times
are CPU-seconds of this process (``time.process_time``; on CUDA wall seconds after a device
synchronize) and the ratios are per repetition (median and min–max): vectorized / bare-vmap
is the issue's "within 1.2x" figure, sequential / vectorized the speed-up of vectorizing.

    python benchmarks/speed/vmap_ceiling.py [--clients 100] [--samples-per-client 128]
                                      [--batch-size 32] [--repeats 3] [--device cpu]
                                      [--threads 1] [--profile] [--quick]

``--profile`` prints torch.profiler's table (self CPU time) of one vectorized round first.
``--quick`` (CI and the GPU window's dry run): 4 clients of 16 samples, batch 8, 2 repeats.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from fedavg_bench import BareData, FedshiftRound, Setting, digits, experiment, sync
from torch.func import functional_call, vmap

from fedshift.engine.assembly import Experiment

METHODS = ("bare-vmap", "vectorized", "sequential")
#: (numerator, denominator) of the paired ratios of seconds per round; the target's pair
#: last, as gpu_window.sh reports a step's last line
PAIRS = (("sequential", "bare-vmap"), ("sequential", "vectorized"), ("vectorized", "bare-vmap"))


class BareVmapRound(BareData):
    """The ceiling: the clients' data stacked and resident (N, n, ...), the global weights
    expanded to N stacked copies, each step one vmapped forward/backward on an index table
    of every client's batch and an in-place SGD with momentum and weight decay; the round
    ends with the mean of the stacked weights (equal client sizes)."""

    def __init__(self, exp: Experiment):
        super().__init__(exp)
        self.x = torch.stack([x for x, _ in self.clients])
        self.y = torch.stack([y for _, y in self.clients])
        model = self.model.train()
        self.trainable = [n for n, _ in model.named_parameters()]
        self.global_ = {k: v.detach().clone() for k, v in model.state_dict().items()}

        def loss(params, buffers, x, y):
            return F.cross_entropy(functional_call(model, {**params, **buffers}, (x,)), y)

        self.losses = vmap(loss)

    def __call__(self) -> int:
        clients, n = self.y.shape
        size, cfg = self.cfg.batch_size, self.cfg
        stacked = {k: v.expand(clients, *v.shape).clone() for k, v in self.global_.items()}
        params = {k: stacked[k].requires_grad_(True) for k in self.trainable}
        buffers = {k: v for k, v in stacked.items() if k not in params}
        weights, momentum = list(params.values()), [torch.zeros_like(p) for p in params.values()]
        rows = torch.arange(clients, device=self.device).view(-1, 1)
        seen = 0
        for _ in range(cfg.local_epochs):
            order = torch.rand(clients, n, device=self.device).argsort(dim=1)
            for start in range(0, n - 1, size):  # a last batch of one sample is dropped
                index = order[:, start : start + size]
                if index.shape[1] < 2:
                    break
                losses = self.losses(params, buffers, self.x[rows, index], self.y[rows, index])
                grads = torch.autograd.grad(losses.sum(), weights)
                with torch.no_grad():
                    if cfg.weight_decay:
                        torch._foreach_add_(grads, weights, alpha=cfg.weight_decay)
                    torch._foreach_mul_(momentum, cfg.momentum)
                    torch._foreach_add_(momentum, grads)
                    torch._foreach_add_(weights, momentum, alpha=-cfg.lr)
                seen += index.numel()
        self.global_ = {k: v.detach().float().mean(0).to(v.dtype) for k, v in stacked.items()}
        return seen


def timed_cpu(work: Callable[[], int], device: torch.device) -> tuple[float, int]:
    """(seconds, samples) of ``work()``: CPU-seconds of this process on the CPU, wall seconds
    after a device synchronize on CUDA (the GPU's time is not the process's)."""
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    sync(device)
    start = clock()
    samples = work()
    sync(device)
    return clock() - start, samples


def measure(
    rounds: dict[str, Callable[[], int]], repeats: int, device: torch.device
) -> dict[str, list[tuple[float, int]]]:
    """(seconds, samples) per method per repetition, after one warm-up round each; the
    methods of a repetition run back to back, in reversed order every other repetition."""
    for run_round in rounds.values():
        run_round()
    timings: dict[str, list[tuple[float, int]]] = {name: [] for name in rounds}
    names = list(rounds)
    for repetition in range(repeats):
        for name in names if repetition % 2 == 0 else reversed(names):
            timings[name].append(timed_cpu(rounds[name], device))
    return timings


def profile_round(run_round: Callable[[], int], rows: int = 20) -> str:
    """torch.profiler's table of one round, by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    run_round()  # warm-up outside the profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run_round()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def tables(clients: int, timings: dict[str, list[tuple[float, int]]], unit: str) -> list[str]:
    lines = [
        f"| clients | method | {unit} per round, median | min | samples/s, median |",
        "|---|---|---|---|---|",
    ]
    for name, rows in timings.items():
        seconds = [s for s, _ in rows]
        rate = statistics.median(samples / s for s, samples in rows)
        lines.append(
            f"| {clients} | {name} | {statistics.median(seconds):.3f} | {min(seconds):.3f} "
            f"| {rate:,.0f} |"
        )
    lines += [
        "",
        f"| clients | ratio of {unit} | median | min–max | pairs |",
        "|---|---|---|---|---|",
    ]
    for a, b in PAIRS:
        if a in timings and b in timings:
            ratios = [x[0] / y[0] for x, y in zip(timings[a], timings[b], strict=True)]
            lines.append(
                f"| {clients} | {a} / {b} | {statistics.median(ratios):.2f} | "
                f"{min(ratios):.2f}–{max(ratios):.2f} | {len(ratios)} |"
            )
    return lines


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--samples-per-client", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profile", action="store_true", help="profile one vectorized round")
    parser.add_argument("--quick", action="store_true", help="4 clients of 16 samples, batch 8")
    args = parser.parse_args(argv)
    if args.quick:
        args.clients, args.samples_per_client, args.batch_size = 4, 16, 8
        args.repeats = min(args.repeats, 2)
    if args.clients < 2 or args.clients % 2:
        parser.error("--clients takes an even number >= 2 (N/2 clients on each of two domains)")
    if args.samples_per_client < 2 or args.batch_size < 2:
        parser.error("--samples-per-client and --batch-size take at least 2 (BatchNorm)")
    methods = args.methods.split(",")
    if unknown := sorted(set(methods) - set(METHODS)):
        parser.error(f"unknown --methods {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("CUDA is not available here; use --device cpu")
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    setting = Setting(
        args.clients,
        args.samples_per_client,
        args.local_epochs,
        args.batch_size,
        args.device,
        args.threads,
    )
    dataset = digits(setting)
    build = {
        "bare-vmap": lambda: BareVmapRound(experiment(setting, dataset)),
        "vectorized": lambda: FedshiftRound(experiment(setting, dataset), vectorize=True),
        "sequential": lambda: FedshiftRound(experiment(setting, dataset), vectorize=False),
    }
    rounds = {name: build[name]() for name in methods}
    if device.type == "cuda":
        where, unit = torch.cuda.get_device_name(), "seconds"
    else:
        capability = torch.backends.cpu.get_cpu_capability()
        where, unit = f"CPU ({capability}), {args.threads} thread(s)", "CPU-seconds"
    header = (
        f"FedAvg round, digit CNN, {args.clients} clients x {args.samples_per_client} samples, "
        f"batch {args.batch_size}, E={args.local_epochs}, SGD momentum+weight decay; {where}; "
        f"torch {torch.__version__}; warm-up + {args.repeats} interleaved repetitions"
    )
    print(header, flush=True)
    if args.profile and "vectorized" in rounds:
        print(profile_round(rounds["vectorized"]), flush=True)
    lines = [header, "", *tables(args.clients, measure(rounds, args.repeats, device), unit)]
    print("\n".join(lines[1:]), flush=True)
    return lines


if __name__ == "__main__":
    main()
