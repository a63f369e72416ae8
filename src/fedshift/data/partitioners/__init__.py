"""The partition schemes, one module each, listed explicitly: adding one is one module
(a :class:`~fedshift.data.partitioners.base.Partitioner` with its name, help and the run keys
it reads) plus one line in :data:`PARTITIONERS`. :func:`fedshift.data.partition.
partition_domains` runs them; the run key ``partition`` names one."""

from __future__ import annotations

from fedshift.core.errors import DatasetError, did_you_mean
from fedshift.data.partitioners.base import ClientSpec, Partitioner, PerDomain
from fedshift.data.partitioners.dirichlet import Dirichlet
from fedshift.data.partitioners.heterogeneity import Heterogeneity
from fedshift.data.partitioners.iid import IID
from fedshift.data.partitioners.nway_kshot import NWayKShot

__all__ = ["PARTITIONERS", "ClientSpec", "Partitioner", "PerDomain", "get_partitioner"]

#: scheme name -> its partitioner
PARTITIONERS: dict[str, Partitioner] = {
    p.name: p
    for p in (
        IID(),
        Dirichlet(),
        NWayKShot(),
        Heterogeneity(),
    )
}


def get_partitioner(name: str) -> Partitioner:
    """The partition scheme ``name``; a DatasetError naming the schemes otherwise."""
    try:
        return PARTITIONERS[name]
    except KeyError:
        raise DatasetError(
            f"unknown partition scheme {name!r}{did_you_mean(name, PARTITIONERS)}; valid "
            f"schemes: {', '.join(PARTITIONERS)}"
        ) from None
