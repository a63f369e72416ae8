"""Split domains into federated clients with a partition scheme of
:data:`fedshift.data.partitioners.PARTITIONERS` (iid, dirichlet, nway-kshot per domain;
FedDG-Benchmark's heterogeneity, whose clients mix domains)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fedshift.core.runconfig import RunConfig, section_keys
from fedshift.data.domains import DatasetError, DomainDataset
from fedshift.data.partitioners import ClientSpec, get_partitioner
from fedshift.data.partitioners.base import PartitionJob

__all__ = ["ROLES", "ClientSpec", "default_options", "domain_client_counts", "partition_domains"]

ROLES = ("source", "target")


def default_options() -> dict[str, Any]:
    """The option values a scheme gets where the caller gives none: the declared defaults
    of the run keys of section ``partition``, and dirichlet's floor of 2 train samples per
    client (``min_samples``)."""
    fields = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    return {name: fields[name] for name in section_keys("partition")} | {"min_samples": 2}


def domain_client_counts(
    clients_per_domain: int | Mapping[str, int], domains: list[str], valid: list[str]
) -> dict[str, int]:
    """Each of ``domains`` -> its client count (>= 1); a mapping naming a domain outside
    ``valid`` (the dataset's domains) is a DatasetError. A valid domain the mapping names but
    ``domains`` leaves out (a held-out target) is ignored, so one mapping serves every target."""
    if isinstance(clients_per_domain, Mapping):
        unknown = [d for d in clients_per_domain if d not in valid]
        if unknown:
            raise DatasetError(
                f"clients_per_domain names unknown domain {unknown[0]!r}; domains: "
                f"{', '.join(valid)}"
            )
        counts = {d: clients_per_domain.get(d, 1) for d in domains}
    else:
        counts = dict.fromkeys(domains, clients_per_domain)
    for d, k in counts.items():
        if isinstance(k, bool) or int(k) != k:
            raise DatasetError(f"clients_per_domain must be an integer, got {k!r} for {d!r}")
        if k < 1:
            raise DatasetError(f"clients_per_domain must be >= 1, got {k} for {d!r}")
    return {d: int(k) for d, k in counts.items()}


def partition_domains(
    dataset: DomainDataset,
    domains: list[str],
    *,
    clients_per_domain: int | Mapping[str, int] = 1,
    scheme: str = "iid",
    seed: int = 0,
    role: str = "source",
    first_id: int = 0,
    **options: Any,
) -> list[ClientSpec]:
    """Make ``clients_per_domain`` clients for each domain in ``domains`` (in that order) with
    partition scheme ``scheme`` (:data:`~fedshift.data.partitioners.PARTITIONERS`); a mapping
    gives each domain its own count (FPL's 3/7/6/4 Digits allocation), 1 for a domain it
    leaves out. ``options`` are the scheme's settings under their run-key names
    (``dirichlet_alpha``, ``ways``, ``shots``, ``stdev``, ``heterogeneity_lambda``; and
    ``min_samples``, dirichlet's floor of train samples per client), each defaulting to
    :func:`default_options`. Client ids are consecutive from ``first_id``. Deterministic
    given ``seed``.
    """
    if isinstance(domains, str):
        domains = [domains]
    domains = list(domains)
    if not domains:
        raise DatasetError(
            f"no domains given; valid domains of {dataset.name!r}: "
            f"{', '.join(dataset.domain_names)}"
        )
    if len(set(domains)) != len(domains):
        raise DatasetError(f"duplicate domains in {domains}; list each domain once")
    for d in domains:
        dataset.domain(d)  # raises DatasetError naming the valid domains
    partitioner = get_partitioner(scheme)
    if role not in ROLES:
        raise DatasetError(f"unknown client role {role!r}; expected one of: {', '.join(ROLES)}")
    counts = domain_client_counts(clients_per_domain, domains, dataset.domain_names)
    given = default_options()
    unknown = [name for name in options if name not in given]
    if unknown:
        raise DatasetError(f"unknown partition option {unknown[0]!r}; options: {', '.join(given)}")
    given.update(options)
    partitioner.check(given)
    options = {name: given[name] for name in (*partitioner.keys, *partitioner.extra)}
    return partitioner.partition(
        PartitionJob(dataset, domains, counts, seed, role, int(first_id), options)
    )
