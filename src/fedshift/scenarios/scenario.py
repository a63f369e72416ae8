"""A scenario: the clients a protocol makes of a dataset, and what is evaluated.

The protocols' builders (:mod:`fedshift.scenarios`) use the helpers here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedshift.core.errors import ConfigError, DatasetError
from fedshift.core.runconfig import RunConfig, listed_domains, per_domain_value
from fedshift.core.split import Split, concat_splits
from fedshift.data.domains import DomainDataset
from fedshift.data.partition import partition_domains
from fedshift.data.partitioners import get_partitioner


@dataclass
class ClientShard:
    """One client's slice of the federated task."""

    client_id: int
    name: str
    domain: str
    role: str
    train: Split
    val: Split
    test: Split


@dataclass
class Scenario:
    """Clients plus what is evaluated.

    ``targets``: domains whose test split is the headline ("target") accuracy;
    ``sources``: domains whose validation split drives model selection (source-val).
    """

    clients: list[ClientShard]
    sources: list[str]
    targets: list[str]
    dataset: DomainDataset
    #: score every client on its own test share (the personalized protocol)
    per_client: bool = False


def pool_clients(clients: list[ClientShard], domain: str) -> ClientShard:
    """All labeled clients merged into one (the centralized reference)."""
    labeled = [c for c in clients if c.role == "source"]
    return ClientShard(
        client_id=0,
        name="pooled-sources",
        domain=domain,
        role="source",
        train=concat_splits([c.train for c in labeled]),
        val=concat_splits([c.val for c in labeled]),
        test=concat_splits([c.test for c in labeled]),
    )


def make_clients(dataset: DomainDataset, specs) -> list[ClientShard]:
    """Materialize partition specs into clients holding their own splits."""
    clients = []
    for spec in specs:
        if spec.mixed:  # a client holding several domains (heterogeneity partition)
            parts = [(dataset.domain(name), tr, va, te) for name, tr, va, te in spec.mixed]
            clients.append(
                ClientShard(
                    client_id=spec.client_id,
                    name=spec.name,
                    domain=spec.domain,
                    role=spec.role,
                    train=concat_splits([d.train.subset(np.asarray(tr)) for d, tr, _, _ in parts]),
                    val=concat_splits([d.val.subset(np.asarray(va)) for d, _, va, _ in parts]),
                    test=concat_splits([d.test.subset(np.asarray(te)) for d, _, _, te in parts]),
                )
            )
            continue
        domain = dataset.domain(spec.domain)
        clients.append(
            ClientShard(
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
    """``partition_domains`` with the run's scheme and the keys of section ``partition`` that
    the scheme reads."""
    scheme = get_partitioner(cfg.partition)
    options = {k: v for k, v in cfg.section("partition").items() if k in scheme.keys}
    counts = per_domain_value(cfg.clients_per_domain, "clients_per_domain", dataset.domain_names, 1)
    return partition_domains(
        dataset,
        sources,
        clients_per_domain=counts,
        scheme=cfg.partition,
        seed=cfg.seed,
        **options,
        **kw,
    )


def server_images(cfg: RunConfig, dataset: DomainDataset, task: Scenario):
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
