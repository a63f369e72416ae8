"""The FedAvg round of ``throughput.py`` on Flower's simulation engine (``flwr[simulation]``,
Ray): one ServerApp sends the global weights to every SuperNode, each ClientApp trains the
digit CNN on its share exactly as the bare loop does (E epochs of SGD, batch 32, a fresh
optimizer), the server averages. Flower runs all rounds in one call, so its rounds are timed
inside the ServerApp, one after another (not interleaved with the other methods).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.simulation import run_simulation

from fedshift.core.reduce import weighted_mean

_CLIENT_DATA: dict[tuple, object] = {}


def _client_data(settings: dict, partition: int):
    """This node's share, built once per Ray worker process (the same partition as fedshift's)."""
    key = tuple(sorted(settings.items()))
    if key not in _CLIENT_DATA:
        from throughput import BareData, Setting, experiment

        torch.set_num_threads(int(settings["threads"]))
        exp = experiment(Setting(**settings))
        _CLIENT_DATA[key] = BareData(exp)
    return _CLIENT_DATA[key], partition


client_app = ClientApp()


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    settings = dict(msg.content["settings"])
    data, partition = _client_data(settings, int(context.node_config["partition-id"]))
    x, y = data.clients[partition]
    model = data.model
    model.load_state_dict(msg.content["model"].to_torch_state_dict())
    model.train()
    opt = data.optimizer(model.parameters())
    seen = 0
    for _ in range(data.cfg.local_epochs):
        for idx in data.batches(len(x)):
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            seen += len(idx)
    content = RecordDict(
        {
            "model": ArrayRecord(torch_state_dict=model.state_dict()),
            "metrics": MetricRecord({"num-examples": len(x), "samples": seen}),
        }
    )
    return Message(content, reply_to=msg)


def make_server_app(weights: dict, settings: dict, rounds: int, timings: list) -> ServerApp:
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        state = weights
        for _ in range(rounds):
            start = time.perf_counter()
            nodes = list(grid.get_node_ids())
            while len(nodes) < settings["clients"]:  # the SuperNodes are still registering
                time.sleep(0.1)
                nodes = list(grid.get_node_ids())
            messages = [
                Message(
                    RecordDict(
                        {
                            "model": ArrayRecord(torch_state_dict=state),
                            "settings": ConfigRecord(settings),
                        }
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
            state = weighted_mean(states, sizes)
            timings.append((time.perf_counter() - start, samples))

    return server_app


def flower_simulation_rounds(
    exp, setting, rounds: int, workers: int = 1
) -> list[tuple[float, int]]:
    """(seconds, samples) of each of ``rounds`` Flower simulation rounds (the first dropped
    as warm-up: Ray workers start and build their data). ``workers`` ClientApps run at once
    (Ray actors of ``cpu_count / workers`` CPUs each); 1 matches fedshift's one process."""
    from fedshift.algorithms.toolkit import state_dict_cpu

    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (here, os.environ.get("PYTHONPATH", "")) if p
    )
    settings = {
        "clients": setting.clients,
        "data_fraction": setting.data_fraction,
        "local_epochs": setting.local_epochs,
        "batch_size": setting.batch_size,
        "device": setting.device,
        "threads": setting.threads,
    }
    weights = state_dict_cpu(exp.algorithm.run.build_model())
    timings: list[tuple[float, int]] = []
    cpus = max(1, (os.cpu_count() or 1) // max(1, workers))
    run_simulation(
        make_server_app(weights, settings, rounds + 1, timings),
        client_app,
        num_supernodes=setting.clients,
        backend_config={"client_resources": {"num_cpus": cpus, "num_gpus": 0.0}},
    )
    return timings[1:]
