"""Split domains into federated clients: IID or Dirichlet label skew inside each domain."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from fedshift.data.domains import DatasetError, DomainDataset

SCHEMES = ("iid", "dirichlet")
ROLES = ("source", "target")
_MAX_DIRICHLET_ATTEMPTS = 200


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

    @property
    def num_train(self) -> int:
        return int(len(self.train_idx))


def _domain_rng(seed: int, domain: str) -> np.random.Generator:
    # Per-domain stream: a domain's partition does not depend on which other domains are listed.
    return np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(domain.encode())])


def _iid(n: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [np.sort(p) for p in np.array_split(rng.permutation(n), k)]


def _split_by_props(idx: np.ndarray, props: np.ndarray) -> list[np.ndarray]:
    cuts = (np.cumsum(props)[:-1] * len(idx)).astype(np.int64)
    return np.split(idx, cuts)


def _dirichlet(
    y_train: np.ndarray,
    y_val: np.ndarray,
    y_test: np.ndarray,
    k: int,
    alpha: float,
    min_samples: int,
    rng: np.random.Generator,
    domain: str,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    classes = np.unique(y_train)
    for _ in range(_MAX_DIRICHLET_ATTEMPTS):
        props = {int(c): rng.dirichlet(np.full(k, alpha)) for c in classes}
        parts: list[list[np.ndarray]] = [[] for _ in range(k)]
        for c in classes:
            idx = rng.permutation(np.flatnonzero(y_train == c))
            for j, share in enumerate(_split_by_props(idx, props[int(c)])):
                parts[j].append(share)
        train = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(t) for t in train) >= min_samples:
            break
    else:
        raise DatasetError(
            f"dirichlet partition of domain {domain!r} into {k} clients with alpha={alpha} left "
            f"a client with fewer than {min_samples} train samples after "
            f"{_MAX_DIRICHLET_ATTEMPTS} attempts; use a larger alpha, fewer clients, or a "
            "smaller min_samples"
        )

    def follow(y: np.ndarray) -> list[np.ndarray]:
        out: list[list[np.ndarray]] = [[] for _ in range(k)]
        for c in np.unique(y):
            # a class absent from train: spread it evenly
            p = props.get(int(c), np.full(k, 1.0 / k))
            idx = rng.permutation(np.flatnonzero(y == c))
            for j, share in enumerate(_split_by_props(idx, p)):
                out[j].append(share)
        return [np.sort(np.concatenate(o)) if o else np.zeros(0, dtype=np.int64) for o in out]

    val, test = follow(y_val), follow(y_test)
    return list(zip(train, val, test, strict=True))


def partition_domains(
    dataset: DomainDataset,
    domains: list[str],
    *,
    clients_per_domain: int = 1,
    scheme: str = "iid",
    alpha: float = 0.5,
    seed: int = 0,
    role: str = "source",
    first_id: int = 0,
    min_samples: int = 2,
) -> list[ClientSpec]:
    """Make ``clients_per_domain`` clients for each domain in ``domains`` (in that order).

    ``scheme="iid"`` shuffles each split and divides it evenly. ``scheme="dirichlet"`` gives
    each client, per class, a Dirichlet(``alpha``) share of the domain's train samples (retrying
    until every client has at least ``min_samples``); its val/test shares follow the same class
    proportions. Client ids are consecutive from ``first_id``. Deterministic given ``seed``.
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
    if scheme not in SCHEMES:
        raise DatasetError(
            f"unknown partition scheme {scheme!r}; valid schemes: {', '.join(SCHEMES)}"
        )
    if role not in ROLES:
        raise DatasetError(f"unknown client role {role!r}; expected one of: {', '.join(ROLES)}")
    if isinstance(clients_per_domain, bool) or int(clients_per_domain) != clients_per_domain:
        raise DatasetError(f"clients_per_domain must be an integer, got {clients_per_domain!r}")
    k = int(clients_per_domain)
    if k < 1:
        raise DatasetError(f"clients_per_domain must be >= 1, got {k}")
    if not alpha > 0:
        raise DatasetError(f"dirichlet alpha must be > 0, got {alpha}")
    if min_samples < 0:
        raise DatasetError(f"min_samples must be >= 0, got {min_samples}")

    specs: list[ClientSpec] = []
    next_id = int(first_id)
    for d in domains:
        dom = dataset.domain(d)
        n_train = len(dom.train)
        if k > n_train:
            raise DatasetError(f"domain {d!r} has {n_train} train samples, too few for {k} clients")
        rng = _domain_rng(seed, d)
        if scheme == "iid":
            shares = list(
                zip(
                    _iid(n_train, k, rng),
                    _iid(len(dom.val), k, rng),
                    _iid(len(dom.test), k, rng),
                    strict=True,
                )
            )
        else:
            if k * min_samples > n_train:
                raise DatasetError(
                    f"domain {d!r} has {n_train} train samples, too few for {k} clients with "
                    f"min_samples={min_samples} each"
                )
            shares = _dirichlet(
                dom.train.y.numpy(),
                dom.val.y.numpy(),
                dom.test.y.numpy(),
                k,
                float(alpha),
                int(min_samples),
                rng,
                d,
            )
        for j, (tr, va, te) in enumerate(shares):
            specs.append(
                ClientSpec(
                    client_id=next_id,
                    name=f"{d}-{j}",
                    domain=d,
                    role=role,
                    train_idx=tr.astype(np.int64),
                    val_idx=va.astype(np.int64),
                    test_idx=te.astype(np.int64),
                )
            )
            next_id += 1
    return specs
