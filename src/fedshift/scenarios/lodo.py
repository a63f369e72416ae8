"""Leave-one-domain-out (FedDG): every domain but the target trains; the target is unseen."""

from __future__ import annotations

from fedshift.core.runconfig import RunConfig
from fedshift.data.domains import DomainDataset
from fedshift.scenarios.protocol import Protocol
from fedshift.scenarios.scenario import Scenario, check_target, make_clients, partition_sources


def build_lodo(cfg: RunConfig, dataset: DomainDataset) -> Scenario:
    """Leave-one-domain-out: every domain but ``cfg.target`` becomes source clients; the
    target's test split is evaluated every round and never seen in training."""
    sources = check_target(cfg, dataset)
    clients = make_clients(dataset, partition_sources(cfg, dataset, sources))
    return Scenario(clients=clients, sources=sources, targets=[cfg.target], dataset=dataset)


PROTOCOL = Protocol(
    name="lodo",
    description="leave-one-domain-out: target domain unseen in training, tested every round",
    build=build_lodo,
)
