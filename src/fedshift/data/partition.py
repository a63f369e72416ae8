"""Split domains into federated clients: IID, Dirichlet or N-way K-shot label skew per domain,
or FedDG-Benchmark's heterogeneity partition, whose clients mix domains."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from fedshift.core.runconfig import PARTITIONS as SCHEMES
from fedshift.data.domains import DatasetError, DomainDataset

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
    #: a client mixing domains (heterogeneity partition): (domain, train, val, test) indices
    #: per domain it holds; ``domain`` and the fields above are then its largest share
    mixed: tuple[tuple[str, np.ndarray, np.ndarray, np.ndarray], ...] = ()


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


def _nway_kshot(
    y_train: np.ndarray,
    y_val: np.ndarray,
    y_test: np.ndarray,
    k: int,
    ways: int,
    shots: int,
    stdev: int,
    rng: np.random.Generator,
    domain: str,
    test_shots: int = 0,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """FedProto's N-way K-shot label skew (Tan et al., AAAI 2022, official ``noniid`` sampling).

    Client j draws ``n_j`` classes uniformly from {max(2, ways - stdev), ..., min(C, ways +
    stdev)} and ``k_j`` shots uniformly from {max(1, shots - stdev), ..., shots + stdev}, then
    ``n_j`` distinct classes and ``k_j`` train samples of each. Train samples are disjoint
    across clients (each class's samples are shuffled once and handed out in turn, as the
    official code hands out disjoint blocks). Validation shares are every val sample of the
    client's classes. Test shares: with ``test_shots`` > 0, ``test_shots`` test samples of
    each of the client's classes, disjoint across clients (the official ``noniid_lt``: 40
    per class on MNIST, each client its own block of the sorted test set; here each class's
    test samples are shuffled once and handed out in turn); with 0, every test sample of the
    client's classes (clients then share them; digits-dg has only 50 per class).

    Deviation notes: the official code draws shots from {shots - stdev + 1, ...,
    shots + stdev - 2} on MNIST and {shots - stdev + 1, ..., shots + stdev} on CIFAR-10 and
    caps ways at C - 1; here shots are symmetric around ``shots`` and ways may reach C.
    """
    classes = np.unique(y_train)
    num_classes = len(classes)
    low = max(2, ways - stdev)
    high = min(num_classes, ways + stdev)
    if low > high:
        raise DatasetError(
            f"nway-kshot partition of domain {domain!r}: ways={ways} ± stdev={stdev} leaves no "
            f"class count in [2, {num_classes}] (each client gets at least 2 classes, as in "
            "FedProto's sampling)"
        )
    ways_per_client = rng.integers(low, high + 1, size=k)
    shots_per_client = rng.integers(max(1, shots - stdev), shots + stdev + 1, size=k)
    pools = {int(c): list(rng.permutation(np.flatnonzero(y_train == c))) for c in classes}
    shares = []
    for n_ways, n_shots in zip(ways_per_client, shots_per_client, strict=True):
        chosen = np.sort(rng.choice(classes, size=int(n_ways), replace=False))
        train = []
        for c in chosen.tolist():
            pool = pools[c]
            if len(pool) < n_shots:
                raise DatasetError(
                    f"nway-kshot partition of domain {domain!r}: class {c} has too few train "
                    f"samples left ({len(pool)}) for another {n_shots}-shot client; use fewer "
                    "clients, fewer shots or fewer ways"
                )
            train.append(np.asarray(pool[:n_shots], dtype=np.int64))
            del pool[:n_shots]
        shares.append(
            (
                np.sort(np.concatenate(train)),
                np.flatnonzero(np.isin(y_val, chosen)),
                np.flatnonzero(np.isin(y_test, chosen)),
            )
        )
    if test_shots > 0:  # drawn after every train share, so those do not depend on it
        shares = _disjoint_test_shots(shares, y_test, test_shots, rng, domain)
    return shares


def _disjoint_test_shots(
    shares: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    y_test: np.ndarray,
    test_shots: int,
    rng: np.random.Generator,
    domain: str,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each client's test share cut to ``test_shots`` samples per class it holds, disjoint
    across clients: each class's test samples shuffled once and handed out in client order."""
    pools = {int(c): list(rng.permutation(np.flatnonzero(y_test == c))) for c in np.unique(y_test)}
    out = []
    for train, val, test in shares:
        own = []
        for c in np.unique(y_test[test]).tolist():
            pool = pools[c]
            if len(pool) < test_shots:
                raise DatasetError(
                    f"nway-kshot partition of domain {domain!r}: class {c} has too few test "
                    f"samples left ({len(pool)}) for another client's test_shots={test_shots}; "
                    "use fewer clients or fewer test_shots (0: every test sample of the class)"
                )
            own.append(np.asarray(pool[:test_shots], dtype=np.int64))
            del pool[:test_shots]
        out.append((train, val, np.sort(np.concatenate(own)) if own else test[:0]))
    return out


def _heterogeneity_weights(sizes: np.ndarray, shards: int, lam: float) -> np.ndarray:
    """(shards x domains) share of each domain's samples each shard gets (columns sum to 1).

    FedDG-Benchmark's partition (Bai et al., ICLR 2024, ``NonIIDSplitter``): with at most as
    many domains as shards, each domain is the *main* domain of one shard, and each further
    shard goes, one at a time, to the domain with the most samples per main shard; a shard
    gets ``(1 - lam)`` of its main domain's samples split evenly among that domain's main
    shards, plus ``lam / shards`` of every domain. With more domains than shards, whole
    domains go (largest first) to the shard holding the fewest samples, mixed the same way.
    ``lam = 1``: every shard has the same domain mix; ``lam = 0``: shards are domain-pure.
    """
    num_domains = len(sizes)
    separated = np.zeros((shards, num_domains))
    if num_domains <= shards:
        main_shards = np.ones(num_domains, dtype=np.int64)
        while main_shards.sum() < shards:
            main_shards[int(np.argmax(sizes / main_shards))] += 1
        row = 0
        for d, count in enumerate(main_shards):
            separated[row : row + count, d] = 1.0 / count
            row += count
    else:
        load = np.zeros(shards)
        for d in np.argsort(-sizes, kind="stable"):
            shard = int(np.argmin(load))
            separated[shard, d] = 1.0
            load[shard] += sizes[d]
    return (1.0 - lam) * separated + lam / shards


def _shard_counts(sizes: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Whole sample counts per (shard, domain) closest to ``weights * sizes``, each column
    summing to its domain's size (the largest remainders round up)."""
    exact = weights * sizes
    counts = np.floor(exact).astype(np.int64)
    for d in range(len(sizes)):
        missing = int(sizes[d] - counts[:, d].sum())
        if missing > 0:
            order = np.argsort(-(exact[:, d] - counts[:, d]), kind="stable")
            counts[order[:missing], d] += 1
    return counts


def _heterogeneity(
    dataset: DomainDataset,
    domains: list[str],
    shards: int,
    lam: float,
    seed: int,
    role: str,
    first_id: int,
) -> list[ClientSpec]:
    """``shards`` clients mixing ``domains`` by :func:`_heterogeneity_weights`; each split of
    each domain is shuffled once (seeded per domain) and handed out in consecutive blocks."""
    if not 0.0 <= lam <= 1.0:
        raise DatasetError(f"heterogeneity lambda must be in [0, 1], got {lam}")
    doms = [dataset.domain(d) for d in domains]
    train_sizes = np.asarray([len(dom.train) for dom in doms], dtype=np.float64)
    weights = _heterogeneity_weights(train_sizes, shards, lam)
    rngs = [_domain_rng(seed, d) for d in domains]
    blocks = {}
    for split in ("train", "val", "test"):
        sizes = np.asarray([len(dom.split(split)) for dom in doms], dtype=np.int64)
        counts = _shard_counts(sizes, weights)
        orders = [rng.permutation(int(n)) for rng, n in zip(rngs, sizes, strict=True)]
        starts = np.zeros(len(doms), dtype=np.int64)
        for shard in range(shards):
            for d in range(len(doms)):
                stop = starts[d] + counts[shard, d]
                blocks[split, shard, d] = np.sort(orders[d][starts[d] : stop])
                starts[d] = stop
    specs = []
    for shard in range(shards):
        parts = tuple(
            (domains[d], *(blocks[split, shard, d] for split in ("train", "val", "test")))
            for d in range(len(doms))
            if len(blocks["train", shard, d])
            or len(blocks["val", shard, d])
            or len(blocks["test", shard, d])
        )
        if not any(len(train) for _, train, _, _ in parts):
            raise DatasetError(
                f"heterogeneity partition into {shards} clients leaves client {shard} without "
                "train samples; use fewer clients"
            )
        main = max(parts, key=lambda part: len(part[1]))
        specs.append(
            ClientSpec(
                client_id=first_id + shard,
                name=f"client{shard}-{main[0]}",
                domain=main[0],
                role=role,
                train_idx=main[1].astype(np.int64),
                val_idx=main[2].astype(np.int64),
                test_idx=main[3].astype(np.int64),
                mixed=parts,
            )
        )
    return specs


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
    alpha: float = 0.5,
    seed: int = 0,
    role: str = "source",
    first_id: int = 0,
    min_samples: int = 2,
    ways: int = 3,
    shots: int = 100,
    stdev: int = 2,
    heterogeneity_lambda: float = 0.1,
    test_shots: int = 0,
) -> list[ClientSpec]:
    """Make ``clients_per_domain`` clients for each domain in ``domains`` (in that order);
    a mapping gives each domain its own count (FPL's 3/7/6/4 Digits allocation), 1 for a
    domain it leaves out.

    ``scheme="iid"`` shuffles each split and divides it evenly. ``scheme="dirichlet"`` gives
    each client, per class, a Dirichlet(``alpha``) share of the domain's train samples (retrying
    until every client has at least ``min_samples``); its val/test shares follow the same class
    proportions. ``scheme="nway-kshot"`` is FedProto's label skew (see :func:`_nway_kshot`):
    about ``ways`` classes of about ``shots`` train samples each per client, both varied by
    ``stdev``; ``test_shots`` > 0 gives each client that many test samples per class,
    disjoint across clients (FedProto's 40 on MNIST). ``scheme="heterogeneity"`` is
    FedDG-Benchmark's partition (see :func:`_heterogeneity_weights`):
    ``clients_per_domain * len(domains)`` clients whose domain mix ``heterogeneity_lambda``
    sets (1: the same mix everywhere, 0: one domain per client). Client ids are consecutive
    from ``first_id``. Deterministic given ``seed``.
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
    counts = domain_client_counts(clients_per_domain, domains, dataset.domain_names)
    if not alpha > 0:
        raise DatasetError(f"dirichlet alpha must be > 0, got {alpha}")
    if min_samples < 0:
        raise DatasetError(f"min_samples must be >= 0, got {min_samples}")
    if test_shots < 0:
        raise DatasetError(f"test_shots must be >= 0, got {test_shots}")
    if scheme == "nway-kshot" and (ways < 1 or shots < 1 or stdev < 0):
        raise DatasetError(
            f"nway-kshot needs ways >= 1, shots >= 1 and stdev >= 0, got ways={ways}, "
            f"shots={shots}, stdev={stdev}"
        )

    if scheme == "heterogeneity":
        return _heterogeneity(
            dataset,
            domains,
            sum(counts.values()),
            float(heterogeneity_lambda),
            seed,
            role,
            int(first_id),
        )
    specs: list[ClientSpec] = []
    next_id = int(first_id)
    for d in domains:
        dom = dataset.domain(d)
        n_train = len(dom.train)
        k = counts[d]
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
        elif scheme == "nway-kshot":
            shares = _nway_kshot(
                dom.train.y.numpy(),
                dom.val.y.numpy(),
                dom.test.y.numpy(),
                k,
                int(ways),
                int(shots),
                int(stdev),
                rng,
                d,
                int(test_shots),
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
