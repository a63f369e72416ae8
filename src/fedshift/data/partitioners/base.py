"""What every partition scheme shares: the client record, the per-domain random stream and
the two shapes a scheme takes (:class:`Partitioner`, and :class:`PerDomain` for a scheme that
splits each domain on its own)."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from fedshift.core.errors import DatasetError

if TYPE_CHECKING:  # the containers import torch; partitioning needs only their fields
    from fedshift.data.domains import Domain, DomainDataset


#: one client's (train, val, test) indices into a domain's splits
Shares = tuple[np.ndarray, np.ndarray, np.ndarray]


@dataclass(frozen=True, eq=False)
class ClientSpec:
    """One client's share of a domain: indices into the domain's train / val / test splits."""

    client_id: int
    name: str
    domain: str
    role: str
    train_idx: np.ndarray
    val_idx: np.ndarray
    test_idx: np.ndarray
    #: a client mixing domains (heterogeneity partition): (domain, train, val, test) indices
    #: per domain it holds; ``domain`` and the fields above are then its largest share
    mixed: tuple[tuple[str, np.ndarray, np.ndarray, np.ndarray], ...] = ()


def domain_rng(seed: int, domain: str) -> np.random.Generator:
    """A domain's own stream: its partition does not depend on which other domains are listed."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(domain.encode())])


@dataclass(frozen=True)
class PartitionJob:
    """What a scheme is asked to split: ``counts[d]`` clients for each domain ``d`` of
    ``domains`` (in that order) with role ``role``, ids from ``first_id``, the run's ``seed``
    and the scheme's ``options``."""

    dataset: DomainDataset
    domains: list[str]
    counts: Mapping[str, int]
    seed: int
    role: str
    first_id: int
    options: Mapping[str, Any]


class Partitioner:
    """A partition scheme: its ``name`` (the run key ``partition``), a one-line ``help``, the
    run keys it reads (``keys``, section ``partition``), settings of the Python API that are
    no run key (``extra``), and :meth:`partition`, which makes the clients; both arrive in
    ``options`` under their names."""

    name: ClassVar[str]
    help: ClassVar[str]
    keys: ClassVar[tuple[str, ...]] = ()
    extra: ClassVar[tuple[str, ...]] = ()

    def check(self, options: Mapping[str, Any]) -> None:
        """Raise DatasetError for option values the scheme cannot use (default: any)."""

    def partition(self, job: PartitionJob) -> list[ClientSpec]:
        """The clients of ``job``."""
        raise NotImplementedError


class PerDomain(Partitioner):
    """A scheme splitting each domain on its own (:meth:`split`), from the domain's stream;
    clients are named ``DOMAIN-j`` and numbered in the order of ``domains``."""

    def split(
        self, dom: Domain, k: int, rng: np.random.Generator, options: Mapping[str, Any]
    ) -> list[Shares]:
        """``k`` clients' shares of domain ``dom``."""
        raise NotImplementedError

    def partition(self, job: PartitionJob) -> list[ClientSpec]:
        specs: list[ClientSpec] = []
        next_id = job.first_id
        for d in job.domains:
            dom = job.dataset.domain(d)
            n_train, k = len(dom.train), job.counts[d]
            if k > n_train:
                raise DatasetError(
                    f"domain {d!r} has {n_train} train samples, too few for {k} clients"
                )
            shares = self.split(dom, k, domain_rng(job.seed, d), job.options)
            for j, (tr, va, te) in enumerate(shares):
                specs.append(
                    ClientSpec(
                        client_id=next_id,
                        name=f"{d}-{j}",
                        domain=d,
                        role=job.role,
                        train_idx=tr.astype(np.int64),
                        val_idx=va.astype(np.int64),
                        test_idx=te.astype(np.int64),
                    )
                )
                next_id += 1
        return specs
