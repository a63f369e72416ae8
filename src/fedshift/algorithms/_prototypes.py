"""Class prototypes: per-class mean embeddings, their aggregation and their use.

Shared by the prototype family (FedProto, BD-FedProto, FPL). A prototype table is a
``dict[int, Tensor]`` from class index to a ``(embed_dim,)`` float tensor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from fedshift.core.context import ClientData

Prototypes = dict[int, torch.Tensor]


@torch.no_grad()
def class_prototypes(
    model: torch.nn.Module,
    data: ClientData,
    device: torch.device,
    batch_size: int = 256,
) -> tuple[Prototypes, dict[int, int]]:
    """Mean ``model.features(x)`` per class over a labeled split, and the class counts.

    Runs in eval mode without gradients (dropout off, BatchNorm running statistics); the
    model's previous train/eval mode is restored afterwards. Sums are accumulated in
    float64 so the mean does not depend on the batch size.
    """
    was_training = model.training
    model.to(device).eval()
    sums: dict[int, torch.Tensor] = {}
    counts: dict[int, int] = {}
    for x, y in data.batches(batch_size, shuffle=False):
        feats = model.features(x).to("cpu", torch.float64)
        labels = y.to("cpu")
        for label in labels.unique().tolist():
            rows = feats[labels == label]
            sums[label] = sums.get(label, 0) + rows.sum(0)
            counts[label] = counts.get(label, 0) + len(rows)
    model.train(was_training)
    protos = {c: (sums[c] / counts[c]).to(torch.float32) for c in sorted(sums)}
    return protos, {c: counts[c] for c in sorted(counts)}


def aggregate_prototypes(
    protos: Sequence[Mapping[int, torch.Tensor]],
    counts: Sequence[Mapping[int, int]],
    weighted: bool,
) -> Prototypes:
    """Global prototype of every class any client holds.

    ``weighted=True`` is FedProto's paper rule: the class-``c`` prototype is the mean of the
    clients' class-``c`` prototypes weighted by their class-``c`` sample counts
    (|D_{i,c}| / |N_c|). ``weighted=False`` is the official code's rule: the plain mean over
    the clients that hold class ``c``. A client without class ``c`` does not take part in
    class ``c``'s mean.
    """
    if len(protos) != len(counts):
        raise ValueError(f"{len(protos)} prototype tables but {len(counts)} count tables")
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
