"""``partition=dirichlet``: label skew inside each domain, a Dirichlet(α) share of every class
per client (Hsu et al. 2019), retried until every client holds ``min_samples`` train samples;
validation and test shares follow the same class proportions."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from fedshift.core.errors import DatasetError
from fedshift.data.partitioners.base import PerDomain, Shares

if TYPE_CHECKING:  # the containers import torch; partitioning needs only their fields
    from fedshift.data.domains import Domain


#: draws of the class proportions before a partition leaving a client too small gives up
MAX_ATTEMPTS = 200


def split_by_props(idx: np.ndarray, props: np.ndarray) -> list[np.ndarray]:
    """``idx`` cut into consecutive parts of the shares ``props`` (summing to 1)."""
    cuts = (np.cumsum(props)[:-1] * len(idx)).astype(np.int64)
    return np.split(idx, cuts)


class Dirichlet(PerDomain):
    name = "dirichlet"
    help = (
        "label skew inside each domain: a Dirichlet(dirichlet_alpha) share of every class per "
        "client; val/test follow the same class proportions"
    )
    keys = ("dirichlet_alpha",)
    extra = ("min_samples",)

    def check(self, options: Mapping[str, Any]) -> None:
        if not options["dirichlet_alpha"] > 0:
            raise DatasetError(f"dirichlet alpha must be > 0, got {options['dirichlet_alpha']}")
        if options["min_samples"] < 0:
            raise DatasetError(f"min_samples must be >= 0, got {options['min_samples']}")

    def split(
        self, dom: Domain, k: int, rng: np.random.Generator, options: Mapping[str, Any]
    ) -> list[Shares]:
        alpha, min_samples = float(options["dirichlet_alpha"]), int(options["min_samples"])
        y_train, y_val, y_test = (dom.split(s).y.numpy() for s in ("train", "val", "test"))
        if k * min_samples > len(y_train):
            raise DatasetError(
                f"domain {dom.name!r} has {len(y_train)} train samples, too few for {k} clients "
                f"with min_samples={min_samples} each"
            )
        classes = np.unique(y_train)
        for _ in range(MAX_ATTEMPTS):
            props = {int(c): rng.dirichlet(np.full(k, alpha)) for c in classes}
            parts: list[list[np.ndarray]] = [[] for _ in range(k)]
            for c in classes:
                idx = rng.permutation(np.flatnonzero(y_train == c))
                for j, share in enumerate(split_by_props(idx, props[int(c)])):
                    parts[j].append(share)
            train = [np.sort(np.concatenate(p)) for p in parts]
            if min(len(t) for t in train) >= min_samples:
                break
        else:
            raise DatasetError(
                f"dirichlet partition of domain {dom.name!r} into {k} clients with alpha={alpha} "
                f"left a client with fewer than {min_samples} train samples after "
                f"{MAX_ATTEMPTS} attempts; use a larger alpha, fewer clients, or a smaller "
                "min_samples"
            )

        def follow(y: np.ndarray) -> list[np.ndarray]:
            out: list[list[np.ndarray]] = [[] for _ in range(k)]
            for c in np.unique(y):
                # a class absent from train: spread it evenly
                p = props.get(int(c), np.full(k, 1.0 / k))
                idx = rng.permutation(np.flatnonzero(y == c))
                for j, share in enumerate(split_by_props(idx, p)):
                    out[j].append(share)
            return [np.sort(np.concatenate(o)) if o else np.zeros(0, dtype=np.int64) for o in out]

        val, test = follow(y_val), follow(y_test)
        return list(zip(train, val, test, strict=True))
