"""From a dataset and a protocol to clients and evaluation sets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fedshift.config import ConfigError, RunConfig, listed_domains
from fedshift.data.domains import DatasetError, DomainDataset, Split
from fedshift.data.partition import partition_domains
from fedshift.engine.protocol_msst import build_msst
from fedshift.engine.protocol_per_domain import build_per_domain, keep_train_fraction
from fedshift.engine.protocol_personalized import build_personalized


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
    """Clients plus what is evaluated.

    ``targets``: domains whose test split is the headline ("target") accuracy;
    ``sources``: domains whose validation split drives model selection (source-val).
    """

    clients: list[ClientData]
    sources: list[str]
    targets: list[str]
    dataset: DomainDataset
    #: score every client on its own test share (the personalized protocol)
    per_client: bool = False


def concat_splits(splits: list[Split]) -> Split:
    masks = [s.mask for s in splits]
    mask = torch.cat(masks) if all(m is not None for m in masks) else None
    return Split(x=torch.cat([s.x for s in splits]), y=torch.cat([s.y for s in splits]), mask=mask)


def build_task(cfg: RunConfig, dataset: DomainDataset, *, pooled: bool) -> FederatedTask:
    """Build the federated task of ``cfg.protocol`` (see :data:`PROTOCOLS`)."""
    builder = PROTOCOLS[cfg.protocol][1]
    task = builder(cfg, dataset)
    task.clients = keep_train_fraction(task.clients, cfg.client_data_fraction, cfg.seed)
    if pooled:
        task.clients = [pool_clients(task.clients, "+".join(task.sources))]
    return task


def pool_clients(clients: list[ClientData], domain: str) -> ClientData:
    """All labeled clients merged into one (the centralized reference)."""
    labeled = [c for c in clients if c.role == "source"]
    return ClientData(
        client_id=0,
        name="pooled-sources",
        domain=domain,
        role="source",
        train=concat_splits([c.train for c in labeled]),
        val=concat_splits([c.val for c in labeled]),
        test=concat_splits([c.test for c in labeled]),
    )


def make_clients(dataset: DomainDataset, specs) -> list[ClientData]:
    """Materialize partition specs into clients holding their own splits."""
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
    return clients


def check_target(cfg: RunConfig, dataset: DomainDataset) -> list[str]:
    """Validate ``cfg.target`` / ``cfg.sources``; returns the source domains."""
    names = dataset.domain_names
    if cfg.target not in names:
        raise ConfigError(
            f"unknown target domain {cfg.target!r} for {dataset.name}; "
            f"choose one of: {', '.join(names)}"
        )
    if cfg.sources:
        sources = listed_domains(cfg.sources, names, dataset.name, "source domain")
        if cfg.target in sources:
            raise ConfigError(
                f"target domain {cfg.target!r} is also a source; leave-one-domain-out keeps the "
                "target out of training"
            )
    else:
        sources = [d for d in names if d != cfg.target]
    if not sources:
        raise ConfigError(
            f"{dataset.name} has a single domain: leave-one-domain-out needs two or more"
        )
    return sources


def partition_sources(cfg: RunConfig, dataset: DomainDataset, sources: list[str], **kw):
    """``partition_domains`` with the run's partition options; errors become ConfigError."""
    try:
        return partition_domains(
            dataset,
            sources,
            clients_per_domain=cfg.clients_per_domain,
            scheme=cfg.partition,
            alpha=cfg.dirichlet_alpha,
            ways=cfg.ways,
            shots=cfg.shots,
            stdev=cfg.stdev,
            seed=cfg.seed,
            **kw,
        )
    except DatasetError as exc:
        raise ConfigError(str(exc)) from None


def build_lodo(cfg: RunConfig, dataset: DomainDataset) -> FederatedTask:
    """Leave-one-domain-out: every domain but ``cfg.target`` becomes source clients; the
    target's test split is evaluated every round and never seen in training."""
    sources = check_target(cfg, dataset)
    clients = make_clients(dataset, partition_sources(cfg, dataset, sources))
    return FederatedTask(clients=clients, sources=sources, targets=[cfg.target], dataset=dataset)


def server_images(cfg: RunConfig, dataset: DomainDataset, task: FederatedTask):
    """The unlabeled images the server holds (``cfg.server_data``), or None.

    ``server_data`` is ``domain`` (its train split) or ``domain:split``. The domain must be
    held by no client, and a target domain's test split is never allowed.
    """
    if not cfg.server_data:
        return None
    domain, _, split = cfg.server_data.partition(":")
    split = split or "train"
    try:
        images = dataset.domain(domain).split(split).x
    except DatasetError as exc:
        raise ConfigError(f"server_data: {exc}") from None
    if domain in {c.domain for c in task.clients}:
        raise ConfigError(
            f"server_data domain {domain!r} is held by a client; name a domain no client holds "
            "(e.g. leave it out of --sources)"
        )
    if domain in task.targets and split == "test":
        raise ConfigError(f"server_data may not be the test split of target domain {domain!r}")
    return images


#: protocol name -> (description, builder). Adding a protocol adds one line here.
PROTOCOLS: dict[str, tuple[str, Callable[[RunConfig, DomainDataset], FederatedTask]]] = {
    "lodo": (
        "leave-one-domain-out: target domain unseen in training, tested every round",
        build_lodo,
    ),
    "personalized": (
        "every domain trains; each client is tested on its own classes; target: clients",
        build_personalized,
    ),
    "msst": ("multi-source single-target: sources labeled, target client unlabeled", build_msst),
    "per-domain": ("every domain trains and is tested (FPL); target: all", build_per_domain),
}
