"""``partition=iid``: each split of a domain shuffled and divided evenly among its clients."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from fedshift.data.partitioners.base import PerDomain, Shares

if TYPE_CHECKING:  # the containers import torch; partitioning needs only their fields
    from fedshift.data.domains import Domain


def even_parts(n: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``range(n)`` shuffled and cut into ``k`` parts of sizes differing by at most one."""
    return [np.sort(p) for p in np.array_split(rng.permutation(n), k)]


class IID(PerDomain):
    name = "iid"
    help = "each domain's splits shuffled and divided evenly among its clients"

    def split(
        self, dom: Domain, k: int, rng: np.random.Generator, options: Mapping[str, Any]
    ) -> list[Shares]:
        return list(
            zip(
                even_parts(len(dom.train), k, rng),
                even_parts(len(dom.val), k, rng),
                even_parts(len(dom.test), k, rng),
                strict=True,
            )
        )
