"""From a dataset and a protocol to clients and evaluation sets."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedshift.config import ConfigError, RunConfig
from fedshift.data.domains import DatasetError, DomainDataset, Split
from fedshift.data.partition import partition_domains


@dataclass
class ClientData:
    """One client's slice of the federated task."""

    client_id: int
    name: str
    domain: str
    role: str
    train: Split
    val: Split
    test: Split


@dataclass
class FederatedTask:
    clients: list[ClientData]
    sources: list[str]
    targets: list[str]
    dataset: DomainDataset


def concat_splits(splits: list[Split]) -> Split:
    masks = [s.mask for s in splits]
    mask = torch.cat(masks) if all(m is not None for m in masks) else None
    return Split(x=torch.cat([s.x for s in splits]), y=torch.cat([s.y for s in splits]), mask=mask)


def build_task(cfg: RunConfig, dataset: DomainDataset, *, pooled: bool) -> FederatedTask:
    """Leave-one-domain-out: every domain but ``cfg.target`` becomes source clients."""
    names = dataset.domain_names
    if cfg.target not in names:
        raise ConfigError(
            f"unknown target domain {cfg.target!r} for {dataset.name}; "
            f"choose one of: {', '.join(names)}"
        )
    if cfg.sources:
        sources = [s.strip() for s in cfg.sources.split(",") if s.strip()]
        unknown = [s for s in sources if s not in names]
        if unknown:
            raise ConfigError(
                f"unknown source domain {unknown[0]!r} for {dataset.name}; "
                f"choose from: {', '.join(names)}"
            )
        if cfg.target in sources:
            raise ConfigError(
                f"target domain {cfg.target!r} is also a source; leave-one-domain-out keeps the "
                "target out of training"
            )
        if len(set(sources)) != len(sources):
            raise ConfigError(f"source domains repeat: {cfg.sources}")
    else:
        sources = [d for d in names if d != cfg.target]
    if not sources:
        raise ConfigError(
            f"{dataset.name} has a single domain: leave-one-domain-out needs two or more"
        )
    try:
        specs = partition_domains(
            dataset,
            sources,
            clients_per_domain=cfg.clients_per_domain,
            scheme=cfg.partition,
            alpha=cfg.dirichlet_alpha,
            seed=cfg.seed,
        )
    except DatasetError as exc:
        raise ConfigError(str(exc)) from None
    clients = []
    for spec in specs:
        domain = dataset.domain(spec.domain)
        clients.append(
            ClientData(
                client_id=spec.client_id,
                name=spec.name,
                domain=spec.domain,
                role=spec.role,
                train=domain.train.subset(np.asarray(spec.train_idx)),
                val=domain.val.subset(np.asarray(spec.val_idx)),
                test=domain.test.subset(np.asarray(spec.test_idx)),
            )
        )
    if pooled:
        clients = [
            ClientData(
                client_id=0,
                name="pooled-sources",
                domain="+".join(sources),
                role="source",
                train=concat_splits([c.train for c in clients]),
                val=concat_splits([c.val for c in clients]),
                test=concat_splits([c.test for c in clients]),
            )
        ]
    return FederatedTask(clients=clients, sources=sources, targets=[cfg.target], dataset=dataset)
