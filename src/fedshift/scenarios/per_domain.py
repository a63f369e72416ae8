"""The per-domain protocol (FPL): every domain trains and every domain's test split is scored.

FPL (Huang et al., CVPR 2023) studies domain shift *among* the participants: all domains hold
clients, and the headline number is the mean test accuracy over the domains. Its Digits setting
gives each client a few percent of a domain's training data, which :func:`keep_train_fraction`
reproduces (run key ``client_data_fraction``, usable with any protocol).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from fedshift.core.errors import ConfigError
from fedshift.core.runconfig import RunConfig, listed_domains
from fedshift.core.seeding import numpy_generator
from fedshift.data.domains import DomainDataset
from fedshift.scenarios.protocol import Protocol
from fedshift.scenarios.scenario import ClientShard, Scenario, make_clients, partition_sources

#: the ``target`` value of a protocol that tests every domain
ALL_DOMAINS = "all"


def per_domain_domains(cfg: RunConfig, dataset: DomainDataset) -> list[str]:
    """The domains that train and are tested: ``cfg.sources`` when given, else all."""
    if cfg.target != ALL_DOMAINS:
        raise ConfigError(
            f"protocol 'per-domain' trains and tests every domain: leave --target out or pass "
            f"--target {ALL_DOMAINS} (got {cfg.target!r}); restrict the domains with --sources"
        )
    if not cfg.sources:
        return list(dataset.domain_names)
    return listed_domains(cfg.sources, dataset.domain_names, dataset.name)


def build_per_domain(cfg: RunConfig, dataset: DomainDataset) -> Scenario:
    """All (or the ``--sources``) domains become labeled clients, ``clients_per_domain`` each;
    every one of them is a target (their test splits) and a source (their validation splits
    drive source-val model selection). ``target_accuracy`` is the mean over the domains."""

    domains = per_domain_domains(cfg, dataset)
    clients = make_clients(dataset, partition_sources(cfg, dataset, domains))
    return Scenario(clients=clients, sources=domains, targets=domains, dataset=dataset)


def keep_train_fraction(
    clients: list[ClientShard],
    fraction: float | Mapping[str, float],
    seed: int,
    pools: Mapping[str, int] | None = None,
) -> list[ClientShard]:
    """Each client keeps a seeded random ``fraction`` of its training share (a mapping: its
    domain's fraction, all of it for a domain the mapping leaves out).

    FPL's Digits setting trains every client on a few percent of a domain (its
    ``percent_dict``); here the fraction applies to the client's share after partitioning, so
    clients stay disjoint. With ``pools`` (domain -> its train + val images,
    ``client_data_of=domain``) a client keeps ``int(fraction * pool)`` of its share instead,
    as FPL's official partition draws ``int(percent * len(train set))`` per client (all of
    its share where that is less). A client keeps at least two samples (one BatchNorm
    batch). The validation and test shares are untouched. Each client's draw depends only
    on ``(seed, client_id)``.
    """
    fractions = fraction if isinstance(fraction, Mapping) else None
    for value in fractions.values() if fractions is not None else [fraction]:
        if not 0 < value <= 1:
            raise ConfigError(f"client_data_fraction must be in (0, 1], got {value}")
    kept = []
    for client in clients:
        share = fractions.get(client.domain, 1.0) if fractions is not None else fraction
        if share == 1:
            kept.append(client)
            continue
        n = len(client.train)
        wanted = round(share * n) if pools is None else int(share * pools[client.domain])
        keep = min(n, max(2, wanted))
        rng = numpy_generator(seed, "client-data-fraction", client.client_id)
        idx = sorted(int(i) for i in rng.choice(n, size=keep, replace=False))
        kept.append(dataclasses.replace(client, train=client.train.subset(idx)))
    return kept


PROTOCOL = Protocol(
    name="per-domain",
    description="every domain trains and is tested (FPL); target: all",
    build=build_per_domain,
    default_target=ALL_DOMAINS,
    scores_training_domains=True,
)
