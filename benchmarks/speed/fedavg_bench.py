"""What the FedAvg benchmarks share (``throughput.py``, ``flower_simulation.py``): the setting
and the experiment it builds, the bare local-SGD loop, and timing helpers. Imports no
benchmark script, so no benchmark imports another.

The setting: FedAvg on the digit CNN (``cnn``), digits-dg sources mnist and syn re-partitioned
into N clients (N/2 IID clients on each). Every client holds the same fixed number of samples
at every client count (each source's train split is repeated as often as needed): with the
natural shares a client of 400 holds 8–10 digits, less than one batch, and a round measures
only per-client overhead, not training.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn.functional as F

from fedshift.algorithms.toolkit import state_dict_cpu
from fedshift.config import resolve
from fedshift.core.runconfig import RunConfig
from fedshift.core.split import dense, to_input
from fedshift.data import DomainDataset, load_dataset
from fedshift.engine.assembly import Experiment, prepare
from fedshift.engine.simulation.dispatch import SimulationFederation

SOURCES = ("mnist", "syn")
TARGET = "mnistm"

T = TypeVar("T")


@dataclass
class Setting:
    """One benchmark point: N clients of ``samples_per_client`` samples each."""

    clients: int
    samples_per_client: int
    local_epochs: int
    batch_size: int
    device: str
    threads: int


def run_config(setting: Setting) -> RunConfig:
    flags = {
        "algorithm": "fedavg",
        "target": TARGET,
        "sources": ",".join(SOURCES),
        "clients_per_domain": setting.clients // len(SOURCES),
        "local_epochs": setting.local_epochs,
        "batch_size": setting.batch_size,
        "model": "cnn",
    }
    # fp32: vectorized clients do not autocast, and the comparison is of the engines
    sets = [f"device={setting.device}", f"threads={setting.threads}", "precision=fp32"]
    return resolve(None, flags, sets)


def digits(setting: Setting) -> DomainDataset:
    """digits-dg as the setting's run loads it (built once into the cache)."""
    cfg = run_config(setting)
    return load_dataset(cfg.dataset, seed=cfg.split_seed)


def fixed_share_dataset(dataset: DomainDataset, setting: Setting) -> DomainDataset:
    """``dataset`` with each source's train split cut or repeated (a seeded permutation, tiled)
    to exactly ``clients/2 * samples_per_client`` samples, so the IID partition gives every
    client ``samples_per_client`` of them. Repeats across clients do not matter for speed."""
    per_domain = setting.clients // len(SOURCES) * setting.samples_per_client
    domains = dict(dataset.domains)
    generator = torch.Generator().manual_seed(0)
    for name in SOURCES:
        train = domains[name].train
        order = torch.randperm(len(train), generator=generator)
        tiled = order[torch.arange(per_domain) % len(train)]
        domains[name] = dataclasses.replace(domains[name], train=train.subset(tiled))
    return dataclasses.replace(dataset, domains=domains)


def experiment(setting: Setting, dataset: DomainDataset | None = None) -> Experiment:
    """The prepared fedshift run of ``setting``; ``dataset`` (digits-dg) skips loading it."""
    base = digits(setting) if dataset is None else dataset
    return prepare(run_config(setting), dataset=fixed_share_dataset(base, setting))


class BareData:
    """Each source client's training split as float tensors on the device, prepared once, and
    the bare local-SGD loop over them (one module, a fresh optimizer per client)."""

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

    def batches(self, n: int) -> list[torch.Tensor]:
        """A shuffled epoch of index batches; a last batch of one sample is dropped
        (BatchNorm), as fedshift does."""
        order = torch.randperm(n, generator=self.generator).to(self.device)
        size = self.cfg.batch_size
        return [order[i : i + size] for i in range(0, n, size) if min(size, n - i) >= 2]

    def local_sgd(self, weights: dict, x: torch.Tensor, y: torch.Tensor) -> int:
        """E epochs of SGD on ``(x, y)`` from ``weights`` in ``self.model``; samples seen."""
        model = self.model
        model.load_state_dict(weights)
        model.train()
        opt = self.optimizer(model.parameters())
        seen = 0
        for _ in range(self.cfg.local_epochs):
            for idx in self.batches(len(x)):
                loss = F.cross_entropy(model(x[idx]), y[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                seen += len(idx)
        return seen


def sync(device: torch.device) -> None:
    """Wait for the device's queued work, so a timer stops when the work is done."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(work: Callable[[], T], device: torch.device) -> tuple[float, T]:
    """(wall seconds, result) of ``work()``, the device synchronized on both ends."""
    sync(device)
    start = time.perf_counter()
    result = work()
    sync(device)
    return time.perf_counter() - start, result


class FedshiftRound:
    """One FedAvg round through fedshift's simulation engine; returns the samples trained."""

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
