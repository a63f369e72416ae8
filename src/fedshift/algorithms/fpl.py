"""FPL: federated prototype learning under domain shift (Huang et al., CVPR 2023)."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from fedshift.algorithms._prototypes import (
    accumulate_class_sums,
    class_means,
    class_prototypes,
    prototype_arrays,
    prototypes_from_arrays,
    stack_prototypes,
)
from fedshift.algorithms.toolkit import (
    call_and_average,
    fit,
    make_optimizer,
    model_from_record,
    model_record,
    weighted_metric,
)
from fedshift.core.algorithm import Algorithm, client_task, local_metrics
from fedshift.core.context import ClientContext
from fedshift.core.federation import Federation
from fedshift.core.hparams import BaseHparams, hp, log_uniform
from fedshift.core.record import Kind, Record
from fedshift.core.schema import ReplySchema, class_names, family
from fedshift.core.state import ServerState


@dataclass(frozen=True)
class FPLHparams(BaseHparams):
    temperature: float = hp(
        0.02,
        "τ",
        "temperature of the CPCL cosine similarities (paper; official infoNCET)",
        low=0,
        low_open=True,
        search=log_uniform(0.01, 0.5),
    )
    upcr_reduction: Literal["sum", "mean"] = hp(
        "mean", "", "UPCR distance: mean = MSELoss (official code); sum = ‖z − U^c‖² (paper)"
    )
    finch_level: int = hp(
        -1, "", "FINCH partition kept: -1 the coarsest (official code), 0 the finest"
    )
    prototype_pass: Literal["train", "eval"] = hp(
        "train",
        "",
        "where local prototypes p_k^c come from: train = the last local epoch's f(x) "
        "(official), eval = a separate pass in eval mode",
    )


def finch_labels(points: np.ndarray, level: int = -1) -> np.ndarray:
    """Cluster labels of ``points`` (n ≥ 2 rows) by FINCH with cosine distance.

    ``level`` picks a column of FINCH's partition hierarchy (-1: the coarsest, as the official
    code's ``c[:, -1]``), run with ``ensure_early_exit=False`` as there.
    """
    with warnings.catch_warnings():
        # finch-clust warns at import that pynndescent (only used for n > 20,000) is missing
        warnings.filterwarnings("ignore", message="pynndescent is not installed")
        from finch import FINCH

    partitions, _, _ = FINCH(
        np.asarray(points, dtype=np.float32), distance="cosine", ensure_early_exit=False
    )
    columns = partitions.shape[1]
    return partitions[:, max(-columns, min(level, columns - 1))]


def cluster_prototypes(protos: torch.Tensor, level: int = -1) -> torch.Tensor:
    """FPL's cluster prototypes of one class: FINCH clusters of the clients' prototypes
    ``(n, d)``, each replaced by its members' mean; ``(K', d)`` in cluster-label order.

    One prototype is its own cluster (the official code skips FINCH for it). Two prototypes
    are each other's first neighbour, so FINCH merges them into one cluster: their mean.
    """
    protos = protos.detach().to("cpu", torch.float64)
    if len(protos) == 1:
        return protos.to(torch.float32)
    labels = finch_labels(protos.numpy(), level)
    means = [protos[torch.from_numpy(labels == c)].mean(0) for c in np.unique(labels)]
    return torch.stack(means).to(torch.float32)


def aggregate_fpl(
    tables: Sequence[Mapping[int, torch.Tensor]], num_classes: int, level: int = -1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cluster prototypes of every class any client holds, and the unbiased prototypes.

    Returns ``(clusters (M, d), cluster_labels (M,), unbiased (num_classes, d))``: the
    clusters of all classes stacked, the class of each, and U^c = the mean of class c's
    cluster prototypes (NaN rows for classes nobody holds).
    """
    by_class: dict[int, list[torch.Tensor]] = {}
    for table in tables:
        for label, proto in table.items():
            by_class.setdefault(int(label), []).append(proto)
    if not by_class:
        raise ValueError("no prototypes to aggregate")
    clusters, labels, unbiased = [], [], {}
    for label in sorted(by_class):
        found = cluster_prototypes(torch.stack(by_class[label]), level)
        clusters.append(found)
        labels.append(torch.full((len(found),), label, dtype=torch.long))
        unbiased[label] = found.to(torch.float64).mean(0).to(torch.float32)
    return torch.cat(clusters), torch.cat(labels), stack_prototypes(unbiased, num_classes)


def cpcl_loss(
    z: torch.Tensor,
    labels: torch.Tensor,
    clusters: torch.Tensor,
    cluster_labels: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """Per-sample L_CPCL = −log(Σ_{p∈P^y} e^{s(z,p)} / Σ_{p∈P} e^{s(z,p)}), s = cos/τ.

    Positives are the sample's class clusters, negatives every other class's clusters.
    Samples whose class has no cluster get 0.
    """
    sims = F.cosine_similarity(z[:, None, :], clusters[None, :, :], dim=-1) / temperature
    positive = cluster_labels[None, :] == labels[:, None]
    pos = torch.logsumexp(sims.masked_fill(~positive, float("-inf")), dim=1)
    loss = torch.logsumexp(sims, dim=1) - pos
    return torch.where(positive.any(dim=1), loss, torch.zeros_like(loss))


def upcr_loss(
    z: torch.Tensor, labels: torch.Tensor, unbiased: torch.Tensor, reduction: str = "mean"
) -> torch.Tensor:
    """Per-sample L_UPCR = Σ_v (z_v − U^y_v)² / d (``"mean"``, the official MSELoss; ``"sum"``
    without / d, the paper's formula). Samples whose class has no unbiased prototype (NaN
    row) get 0."""
    target = unbiased[labels]
    known = ~torch.isnan(target).any(dim=1)
    diff = (z - torch.nan_to_num(target, nan=0.0)).pow(2)
    loss = diff.sum(dim=1) if reduction == "sum" else diff.mean(dim=1)
    return torch.where(known, loss, torch.zeros_like(loss))


class FPL(Algorithm):
    """FPL: clients send their model and per-class prototypes p_k^c (mean feature f(x) of class
    c). For every class the server clusters the clients' prototypes with FINCH (cosine) into
    cluster prototypes P^c and averages those into the unbiased prototype U^c; the model is
    FedAvg'ed. Local loss: CE + L_CPCL + L_UPCR, with L_CPCL an InfoNCE of f(x) against all
    cluster prototypes (positives P^y, negatives the other classes' clusters, cosine,
    τ = 0.02) and L_UPCR = ‖f(x) − U^y‖² / d. Both regularizers are summed over the batch and
    divided by its size; round 1 (no prototypes yet) is plain CE. Prediction: the classifier.

    Deviation notes:
    - Local prototypes p_k^c are, as in the official code, the mean of the detached f(x) of
      the last local epoch (train mode, while the model changes; the paper leaves this
      open). ``prototype_pass="eval"`` takes a separate pass after training in eval mode
      instead (``_prototypes.class_prototypes``); with BatchNorm running statistics that
      lag the batch statistics (few local steps), those prototypes sit far from the
      train-mode features and L_UPCR blows up, so it is not the default.
    - L_UPCR averages the squared distance over the d feature dimensions, as the official
      code's MSELoss does; the paper writes the squared norm ``‖z − U^c‖²``
      (``upcr_reduction="sum"``, d = 256 times larger). Measured on digits-dg per-domain
      (5 clients per domain, 30% of each train split, 30 rounds, seed 0): with the sum the
      regularizer swamps CE (train loss 84 in round 2) and FPL collapses to 16.2 % mean
      accuracy (FedAvg 68.5 %); with the mean it reaches 76.2 %.
    - The official code keeps FINCH's coarsest partition (``c[:, -1]``); ``finch_level``
      picks another. A class with a single client prototype keeps it as its only cluster
      (the official code's fallback); two prototypes always form one FINCH cluster.
    - Clustering is unweighted (as in the official code); the model mean is weighted by
      sample counts (the official ``weight`` averaging).
    - τ = 0.02 is the paper's value and the official ``main.py`` default (``--infoNCET``);
      only the first release of ``main.py`` (commit a52a765, 2023-03-16) had 0.1, changed
      to 0.02 on 2023-03-20.
    - Local training length and weight decay are the run's, not the official ones: the
      official ``main.py`` defaults ``--local_epoch`` to 10 (and 100 rounds, 10 clients),
      and ``FPL._train_net`` (``models/fpl.py``) builds a fresh SGD each round with
      momentum 0.9 and weight decay 1e-5 (lr 0.01 and batch 64 from
      ``utils/best_args.py``). fedshift's run defaults are 1 local epoch and weight decay
      5e-4 (momentum, lr and batch size agree); ``--local-epochs 10 --set
      weight_decay=1e-5`` gives the official values.
    """

    name = "fpl"
    paper = (
        "Huang, Ye, Shi, Li and Du, Rethinking Federated Learning with Domain Shift: "
        "A Prototype View, CVPR 2023"
    )
    Hparams = FPLHparams
    shares = {"model": Kind.MODEL, "prototype": Kind.PROTOTYPE}

    def round(self, state: ServerState, fed: Federation):
        """1. The sampled clients train from the global model and the last round's cluster
        and unbiased prototypes, and reply with their model and class prototypes; 2. the
        server keeps the sample-weighted mean of the models; 3. it clusters each class's
        prototypes with FINCH into P^c and averages those into U^c."""
        # 1. local training
        sent = Record().with_arrays("model", state.model)
        if "clusters" in state.extra:
            sent.with_arrays(
                "global",
                {k: state.extra[k] for k in ("clusters", "cluster_labels", "unbiased")},
            )
        # 2. FedAvg of the models, folded in as the replies arrive
        replies, means = call_and_average(fed, sent, self.run.aggregator)
        metrics = {
            "train_loss": weighted_metric(replies, "loss"),
            "prototype_loss": weighted_metric(replies, "prototype_loss"),
        }
        if not replies:
            return state, metrics
        state.model = means["model"]
        # 3. cluster prototypes P^c and unbiased prototypes U^c
        tables = [prototypes_from_arrays(r.arrays)[0] for r in replies.values()]
        if any(tables):
            clusters, labels, unbiased = aggregate_fpl(
                tables, self.run.num_classes, self.hp.finch_level
            )
            state.extra.update(clusters=clusters, cluster_labels=labels, unbiased=unbiased)
            metrics["clusters_per_class"] = len(clusters) / len(labels.unique())
        return state, metrics

    def reply_schema(self, task: str, sent: Record) -> ReplySchema:
        """``train``: the model back, plus a prototype per class the client holds."""
        schema = super().reply_schema(task, sent)
        if task == "train":
            classes = class_names(self.run.num_classes)
            schema.update(family("prototype", (None,), torch.float32, names=classes))
        return schema

    @client_task("train")
    def train(self, ctx: ClientContext, record: Record) -> Record:
        cfg, device = ctx.train_cfg, ctx.device
        model = model_from_record(ctx, record)
        model.train()
        received = record.subset("global")
        if received:
            clusters = received["clusters"].to(device)
            cluster_labels = received["cluster_labels"].to(device)
            unbiased = received["unbiased"].to(device)
        feature_sums: dict[int, torch.Tensor] = {}
        class_counts: dict[int, int] = {}
        epoch = -1  # fit calls epoch_batches() once per epoch

        def epoch_batches():
            nonlocal epoch
            epoch += 1
            return ctx.train.batches(cfg.batch_size, ctx.rng)

        def step_loss(x: torch.Tensor, y: torch.Tensor):
            features = model.features(x)
            loss = F.cross_entropy(model.classifier(features), y)
            if self.hp.prototype_pass == "train" and epoch == cfg.local_epochs - 1:
                accumulate_class_sums(feature_sums, class_counts, features.detach(), y)
            if not received:  # no global prototypes yet (round 1): plain CE
                return loss, {"prototype_loss": features.new_zeros(())}
            cpcl = cpcl_loss(features, y, clusters, cluster_labels, self.hp.temperature)
            upcr = upcr_loss(features, y, unbiased, self.hp.upcr_reduction)
            proto_loss = (cpcl + upcr).sum() / len(x)
            return loss + proto_loss, {"prototype_loss": proto_loss}

        sums, seen = fit(
            make_optimizer(model.parameters(), cfg),
            cfg.local_epochs,
            epoch_batches,
            step_loss,
            terms=("prototype_loss",),
            precision=ctx.precision,
        )
        if self.hp.prototype_pass == "eval" or not class_counts:
            protos, _ = class_prototypes(model, ctx.train, device)
        else:
            protos = class_means(feature_sums, class_counts)
        reply = model_record(model)
        reply.arrays.update(prototype_arrays(protos))
        reply.metrics.update(local_metrics(ctx, seen, **sums))
        return reply
