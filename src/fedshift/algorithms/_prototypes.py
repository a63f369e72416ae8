"""Class prototypes: per-class mean embeddings, their aggregation and their use.

Shared by the prototype family (FedProto, BD-FedProto, FPL). A prototype table is a
``dict[int, Tensor]`` from class index to a ``(embed_dim,)`` float tensor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedshift.core.context import SplitView
from fedshift.core.robust import Aggregator

Prototypes = dict[int, torch.Tensor]


@torch.no_grad()
def local_statistics(
    model: torch.nn.Module,
    data: SplitView,
    device: torch.device,
    batch_size: int = 256,
    *,
    with_mi: bool = False,
) -> tuple[Prototypes, dict[int, int], float]:
    """Class prototypes, class counts and (``with_mi``) the MI diagnostic in one pass.

    Runs in eval mode without gradients (dropout off, BatchNorm running statistics); the
    model's previous train/eval mode is restored afterwards. Sums are accumulated in
    float64 so the mean does not depend on the batch size. MI is :func:`mutual_information`
    of the classifier's softmax over the split (NaN when ``with_mi`` is False).
    """
    was_training = model.training
    model.to(device).eval()
    sums: dict[int, torch.Tensor] = {}
    counts: dict[int, int] = {}
    probs = []
    for x, y in data.batches(batch_size, shuffle=False):
        feats = model.features(x)
        if with_mi:
            probs.append(torch.softmax(model.classifier(feats), dim=1).to("cpu", torch.float64))
        accumulate_class_sums(sums, counts, feats, y)
    model.train(was_training)
    protos = class_means(sums, counts)
    mi = mutual_information(torch.cat(probs)) if probs else float("nan")
    return protos, {c: counts[c] for c in sorted(counts)}, mi


def accumulate_class_sums(
    sums: dict[int, torch.Tensor],
    counts: dict[int, int],
    features: torch.Tensor,
    labels: torch.Tensor,
) -> None:
    """Add a batch's per-class feature sums (float64, CPU) and counts to running totals."""
    features, labels = features.to("cpu", torch.float64), labels.to("cpu")
    for label in labels.unique().tolist():
        rows = features[labels == label]
        sums[label] = sums.get(label, 0) + rows.sum(0)
        counts[label] = counts.get(label, 0) + len(rows)


def class_means(sums: Mapping[int, torch.Tensor], counts: Mapping[int, int]) -> Prototypes:
    """The float32 prototype table of running per-class sums and counts, by class."""
    return {c: (sums[c] / counts[c]).to(torch.float32) for c in sorted(sums)}


def class_prototypes(
    model: torch.nn.Module,
    data: SplitView,
    device: torch.device,
    batch_size: int = 256,
) -> tuple[Prototypes, dict[int, int]]:
    """Mean ``model.features(x)`` per class over a labeled split, and the class counts.

    Eval mode, no gradients (see :func:`local_statistics`).
    """
    protos, counts, _ = local_statistics(model, data, device, batch_size)
    return protos, counts


def mutual_information(probs: torch.Tensor) -> float:
    """MI = H(p̂) − mean_i H(p_i) (BD-FedProto eq. 4), natural log.

    ``probs`` is ``(N, C)``, each row a predicted class distribution p_i on local data, and
    p̂ their mean. High MI: confident predictions spread over many classes; 0 for identical
    or uniform predictions.
    """
    if probs.numel() == 0:
        return float("nan")
    probs = probs.to(torch.float64)

    def entropy(p: torch.Tensor) -> torch.Tensor:
        return -(p * torch.log(p.clamp_min(1e-12))).sum(-1)

    return float(entropy(probs.mean(0)) - entropy(probs).mean())


def aggregate_prototypes(
    protos: Sequence[Mapping[int, torch.Tensor]],
    counts: Sequence[Mapping[int, int]],
    weighted: bool,
    aggregator: Aggregator,
) -> Prototypes:
    """Global prototype of every class any client holds.

    ``weighted=True`` is FedProto's paper rule: the class-``c`` prototype is the mean of the
    clients' class-``c`` prototypes weighted by their class-``c`` sample counts
    (|D_{i,c}| / |N_c|). ``weighted=False`` is the official code's rule: the plain mean over
    the clients that hold class ``c``. A client without class ``c`` does not take part in
    class ``c``'s mean.

    A robust ``aggregator`` (not ``mean``) combines each class's prototypes over the clients
    holding that class, unweighted; a class held by fewer clients than its bound needs
    fails the round (:class:`~fedshift.core.robust.AggregationError`).
    """
    if len(protos) != len(counts):
        raise ValueError(f"{len(protos)} prototype tables but {len(counts)} count tables")
    if not aggregator.is_mean:
        held: dict[int, list[torch.Tensor]] = {}
        for table, table_counts in zip(protos, counts, strict=True):
            for label, proto in table.items():
                if float(table_counts[label]) > 0:
                    held.setdefault(label, []).append(proto)
        return {
            c: aggregator([{"p": p} for p in held[c]], [1.0] * len(held[c]))["p"].to(torch.float32)
            for c in sorted(held)
        }
    sums: dict[int, torch.Tensor] = {}
    totals: dict[int, float] = {}
    for table, table_counts in zip(protos, counts, strict=True):
        for label, proto in table.items():
            weight = float(table_counts[label]) if weighted else 1.0
            if weight <= 0:
                continue
            sums[label] = sums.get(label, 0) + weight * proto.detach().to("cpu", torch.float64)
            totals[label] = totals.get(label, 0.0) + weight
    return {c: (sums[c] / totals[c]).to(torch.float32) for c in sorted(sums)}


def stack_prototypes(protos: Mapping[int, torch.Tensor], num_classes: int) -> torch.Tensor:
    """A ``(num_classes, embed_dim)`` table with NaN rows for classes without a prototype."""
    if not protos:
        raise ValueError("no prototypes to stack")
    dim = next(iter(protos.values())).shape[-1]
    table = torch.full((num_classes, dim), float("nan"))
    for label, proto in protos.items():
        table[label] = proto
    return table


def nearest_prototype_scores(features: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Class scores ``-‖f − p_c‖₂`` for a ``(num_classes, dim)`` table (NaN rows -> -inf).

    The argmax is FedProto's inference rule: the class of the nearest global prototype.
    """
    dist = torch.cdist(features.float(), torch.nan_to_num(table.float(), nan=0.0))
    missing = torch.isnan(table).any(dim=1)
    scores = -dist
    scores[:, missing] = float("-inf")
    return scores


def prototype_loss(
    features: torch.Tensor, labels: torch.Tensor, table: torch.Tensor | None
) -> torch.Tensor:
    """FedProto's regularizer as in its official code: ``MSELoss(f(x), C̄(y))``.

    The squared error is averaged over every element of the ``(N, dim)`` batch; samples whose
    class has no global prototype (a NaN row of ``table``) contribute zero but still count in
    the mean, as the official code substitutes their own feature for the target. 0 when
    ``table`` is None (round 1, before any global prototype exists).
    """
    if table is None:
        return features.new_zeros(())
    targets = table.to(features.device, features.dtype)[labels]
    known = ~torch.isnan(targets).any(dim=1, keepdim=True)
    diff = torch.where(known, features - torch.nan_to_num(targets), torch.zeros_like(features))
    return diff.pow(2).mean()


def prototype_arrays(protos: Mapping[int, torch.Tensor], counts: Mapping[int, int] | None = None):
    """Reply arrays ``prototype.<c>`` (and ``count.<c>``, int64 scalars) of a prototype table."""
    arrays = {f"prototype.{c}": p.detach().to("cpu", torch.float32) for c, p in protos.items()}
    for c, n in (counts or {}).items():
        arrays[f"count.{c}"] = torch.tensor(int(n), dtype=torch.int64)
    return arrays


def prototypes_from_arrays(
    arrays: Mapping[str, torch.Tensor],
) -> tuple[Prototypes, dict[int, int]]:
    """Inverse of :func:`prototype_arrays`."""
    protos, counts = {}, {}
    for key, value in arrays.items():
        share, _, label = key.partition(".")
        if share == "prototype":
            protos[int(label)] = value
        elif share == "count":
            counts[int(label)] = int(value)
    return dict(sorted(protos.items())), dict(sorted(counts.items()))


class PrototypeModel(torch.nn.Module):
    """A client's network plus the global prototypes it last received (buffer ``prototypes``,
    ``(num_classes, dim)``, NaN rows for classes it holds no prototype of), so nearest-prototype
    prediction works from the client's state alone."""

    def __init__(self, net: torch.nn.Module, prototypes: torch.Tensor):
        super().__init__()
        self.net = net
        self.register_buffer("prototypes", prototypes.clone())

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.net.features(x)

    def classifier(self, f: torch.Tensor) -> torch.Tensor:
        return self.net.classifier(f)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    @property
    def has_prototypes(self) -> bool:
        return bool((~torch.isnan(self.prototypes)).any())
