"""``partition=nway-kshot``: FedProto's N-way K-shot label skew inside each domain."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from fedshift.core.errors import DatasetError
from fedshift.data.partitioners.base import PerDomain, Shares

if TYPE_CHECKING:  # the containers import torch; partitioning needs only their fields
    from fedshift.data.domains import Domain


class NWayKShot(PerDomain):
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

    name = "nway-kshot"
    help = (
        "FedProto's label skew inside each domain: about `ways` classes of about `shots` train "
        "samples per client, both varied by `stdev`; `test_shots` > 0: that many test "
        "samples per class and client, disjoint across clients"
    )
    keys = ("ways", "shots", "stdev", "test_shots")

    def check(self, options: Mapping[str, Any]) -> None:
        if options["test_shots"] < 0:
            raise DatasetError(f"test_shots must be >= 0, got {options['test_shots']}")
        ways, shots, stdev = options["ways"], options["shots"], options["stdev"]
        if ways < 1 or shots < 1 or stdev < 0:
            raise DatasetError(
                f"nway-kshot needs ways >= 1, shots >= 1 and stdev >= 0, got ways={ways}, "
                f"shots={shots}, stdev={stdev}"
            )

    def split(
        self, dom: Domain, k: int, rng: np.random.Generator, options: Mapping[str, Any]
    ) -> list[Shares]:
        ways, shots, stdev, test_shots = (int(options[key]) for key in self.keys)
        y_train, y_val, y_test = (dom.split(s).y.numpy() for s in ("train", "val", "test"))
        domain = dom.name
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
            shares = disjoint_test_shots(shares, y_test, test_shots, rng, domain)
        return shares


def disjoint_test_shots(
    shares: list[Shares],
    y_test: np.ndarray,
    test_shots: int,
    rng: np.random.Generator,
    domain: str,
) -> list[Shares]:
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
