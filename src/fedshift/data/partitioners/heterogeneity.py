"""``partition=heterogeneity``: FedDG-Benchmark's partition (Bai et al., ICLR 2024), whose
clients mix the source domains in a proportion ``heterogeneity_lambda`` (λ) sets."""

from __future__ import annotations

import numpy as np

from fedshift.core.errors import DatasetError
from fedshift.data.partitioners.base import ClientSpec, Partitioner, PartitionJob, domain_rng


def heterogeneity_weights(sizes: np.ndarray, shards: int, lam: float) -> np.ndarray:
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


def shard_counts(sizes: np.ndarray, weights: np.ndarray) -> np.ndarray:
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


class Heterogeneity(Partitioner):
    """``clients_per_domain * len(domains)`` clients mixing ``domains`` by
    :func:`heterogeneity_weights`; each split of each domain is shuffled once (seeded per
    domain) and handed out in consecutive blocks."""

    name = "heterogeneity"
    help = (
        "FedDG-Benchmark's partition across the source domains: heterogeneity_lambda (--set "
        "lambda=L) 1 gives every client the same domain mix, 0 each client one domain"
    )
    keys = ("heterogeneity_lambda",)

    def partition(self, job: PartitionJob) -> list[ClientSpec]:
        dataset, domains = job.dataset, job.domains
        shards, lam = sum(job.counts.values()), float(job.options["heterogeneity_lambda"])
        if not 0.0 <= lam <= 1.0:
            raise DatasetError(f"heterogeneity lambda must be in [0, 1], got {lam}")
        doms = [dataset.domain(d) for d in domains]
        train_sizes = np.asarray([len(dom.train) for dom in doms], dtype=np.float64)
        weights = heterogeneity_weights(train_sizes, shards, lam)
        rngs = [domain_rng(job.seed, d) for d in domains]
        blocks = {}
        for split in ("train", "val", "test"):
            sizes = np.asarray([len(dom.split(split)) for dom in doms], dtype=np.int64)
            counts = shard_counts(sizes, weights)
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
                    client_id=job.first_id + shard,
                    name=f"client{shard}-{main[0]}",
                    domain=main[0],
                    role=job.role,
                    train_idx=main[1].astype(np.int64),
                    val_idx=main[2].astype(np.int64),
                    test_idx=main[3].astype(np.int64),
                    mixed=parts,
                )
            )
        return specs
