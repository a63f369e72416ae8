"""The FedAvg round of ``throughput.py`` on Flower's simulation engine (``flwr[simulation]``,
Ray): one ServerApp sends the global weights to every SuperNode, each ClientApp trains the
digit CNN on its share with the bare local-SGD loop of ``fedavg_bench.py`` (E epochs of SGD,
batch 32, a fresh optimizer), the server averages. Flower runs all rounds in one call, so its
rounds are timed inside the ServerApp, one after another; the first is dropped as warm-up
(Ray workers start and build their data).

    python benchmarks/speed/flower_simulation.py [--clients 100] [--samples-per-client 128]
                                           [--repeats 5] [--workers 1] [--timings FILE]

``throughput.py --flower`` runs this script in a child process and reads ``--timings`` (a
JSON list of [seconds, samples] per round).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import time
from functools import partial
from pathlib import Path

import torch
from fedavg_bench import BareData, Setting, experiment, timed
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedshift.algorithms.toolkit import state_dict_cpu
from fedshift.core.reduce import weighted_mean

_CLIENT_DATA: dict[tuple, BareData] = {}


def _client_data(settings: dict) -> BareData:
    """Every client's share, built once per Ray worker process (the same partition as
    fedshift's)."""
    key = tuple(sorted(settings.items()))
    if key not in _CLIENT_DATA:
        torch.set_num_threads(int(settings["threads"]))
        _CLIENT_DATA[key] = BareData(experiment(Setting(**settings)))
    return _CLIENT_DATA[key]


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    data = _client_data(dict(msg.content["settings"]))
    x, y = data.clients[int(context.node_config["partition-id"])]
    seen = data.local_sgd(msg.content["model"].to_torch_state_dict(), x, y)
    content = RecordDict(
        {
            "model": ArrayRecord(torch_state_dict=data.model.state_dict()),
            "metrics": MetricRecord({"num-examples": len(x), "samples": seen}),
        }
    )
    return Message(content, reply_to=msg)


def flower_round(grid: Grid, state: dict, settings: dict) -> tuple[dict, int]:
    """One FedAvg round over every SuperNode: (the new global weights, samples seen)."""
    nodes = list(grid.get_node_ids())
    messages = [
        Message(
            RecordDict(
                {"model": ArrayRecord(torch_state_dict=state), "settings": ConfigRecord(settings)}
            ),
            dst_node_id=node,
            message_type="train",
        )
        for node in nodes
    ]
    answered = list(grid.send_and_receive(messages))
    replies = [r for r in answered if r.has_content()]
    if len(replies) < len(answered):
        failed = next(r for r in answered if not r.has_content())
        raise RuntimeError(f"a Flower client failed: {failed.error.reason}")
    states = [r.content["model"].to_torch_state_dict() for r in replies]
    sizes = [int(r.content["metrics"]["num-examples"]) for r in replies]
    samples = sum(int(r.content["metrics"]["samples"]) for r in replies)
    return weighted_mean(states, sizes), samples


def make_server_app(weights: dict, settings: dict, rounds: int, timings: list) -> ServerApp:
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        while len(list(grid.get_node_ids())) < settings["clients"]:  # SuperNodes registering
            time.sleep(0.1)
        state = weights
        device = torch.device(settings["device"])
        for _ in range(rounds):
            seconds, (state, samples) = timed(partial(flower_round, grid, state, settings), device)
            timings.append((seconds, samples))

    return server_app


def flower_simulation_rounds(setting: Setting, rounds: int, workers: int = 1):
    """(seconds, samples) of each of ``rounds`` Flower simulation rounds after a warm-up
    round. ``workers`` ClientApps run at once (Ray actors of ``cpu_count / workers`` CPUs
    each); 1 matches fedshift's one process."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH", "")) if p
    )
    settings = {
        "clients": setting.clients,
        "samples_per_client": setting.samples_per_client,
        "local_epochs": setting.local_epochs,
        "batch_size": setting.batch_size,
        "device": setting.device,
        "threads": setting.threads,
    }
    weights = state_dict_cpu(BareData(experiment(setting)).model)
    timings: list[tuple[float, int]] = []
    cpus = max(1, (os.cpu_count() or 1) // max(1, workers))
    run_simulation(
        make_server_app(weights, settings, rounds + 1, timings),
        client_app,
        num_supernodes=setting.clients,
        backend_config={"client_resources": {"num_cpus": cpus, "num_gpus": 0.0}},
    )
    return timings[1:]


def main(argv: list[str] | None = None) -> list[tuple[float, int]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--samples-per-client", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1, help="ClientApps run at once")
    parser.add_argument("--timings", help="write [[seconds, samples], ...] here as JSON")
    args = parser.parse_args(argv)
    if args.clients < 2 or args.clients % 2:
        parser.error("--clients takes an even number >= 2 (N/2 clients on each of two domains)")
    if importlib.util.find_spec("ray") is None:
        raise SystemExit("Ray is missing: pip install -e '.[bench]' (flwr[simulation])")
    torch.set_num_threads(args.threads)
    setting = Setting(
        args.clients,
        args.samples_per_client,
        args.local_epochs,
        args.batch_size,
        args.device,
        args.threads,
    )
    timings = flower_simulation_rounds(setting, args.repeats, args.workers)
    rates = [samples / seconds for seconds, samples in timings]
    print(
        f"flower-sim, {args.clients} clients: samples/s min {min(rates):,.0f}, "
        f"median {statistics.median(rates):,.0f} over {len(rates)} rounds"
    )
    if args.timings:
        Path(args.timings).write_text(json.dumps(timings))
    return timings


if __name__ == "__main__":
    main()
