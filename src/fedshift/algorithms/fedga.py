"""FedGA: generalization adjustment of aggregation weights (Zhang et al., CVPR 2023)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.toolkit import (
    model_from_record,
    model_record,
    proximal_penalty,
    train_supervised,
    weighted_metric,
)
from fedshift.core.algorithm import client_task
from fedshift.core.context import ClientContext, SplitView
from fedshift.core.federation import Federation
from fedshift.core.hparams import BaseHparams, hp, uniform
from fedshift.core.record import Kind, Record
from fedshift.core.schema import ArraySpec, ReplySchema
from fedshift.core.state import ServerState

Base = Literal["fedavg", "fedprox"]
Variant = Literal["paper", "official"]
GapMetric = Literal["loss", "accuracy"]


@dataclass(frozen=True)
class FedGAHparams(BaseHparams):
    step: float = hp(
        0.2,
        "d",
        "initial step of the aggregation-weight update, d_t = (1 − t/T)·d",
        low=0,
        high=1,
        low_open=True,
        high_open=True,
        search=uniform(0.05, 0.5),
    )
    variant: Variant = hp(
        "paper", "", "weight update: paper = centred gaps, step d_t; official = uncentred, d_t/3"
    )
    base: Base = hp("fedavg", "", "local training of the wrapped method: fedavg or fedprox")
    mu: float = hp(0.01, "μ", "FedProx proximal weight (only with base=fedprox)", low=0)
    gap_metric: GapMetric = hp(
        "loss",
        "",
        "generalization gap G_k: loss = L(θ) − L(θ_k) (paper); accuracy = acc(θ_k) − acc(θ) "
        "on the validation split (the official scripts' default)",
    )


def ga_update(
    weights: torch.Tensor, gaps: torch.Tensor, step: float, *, variant: Variant = "paper"
) -> torch.Tensor:
    """One generalization-adjustment step on aggregation weights ``a`` from gaps ``G``.

    paper:    a_k += d_t·(G_k − μ)/max_l |G_l − μ|, μ = mean G; clip at 0; renormalize.
    official: a_k += (d_t/3)·G_k/max_l |G_l|;        clip to [0, 1]; renormalize.
    All gaps equal (zero spread) leaves the weights unchanged but renormalized.
    """
    gaps = gaps.to(torch.float64)
    weights = weights.to(torch.float64)
    if variant == "paper":
        spread = gaps - gaps.mean()
        upper = None
    else:
        spread = gaps
        step = step / 3.0
        upper = 1.0
    scale = spread.abs().max()
    new = weights + step * spread / scale if float(scale) > 0 else weights.clone()
    new = new.clamp(min=0.0, max=upper)
    total = new.sum()
    return new / total if float(total) > 0 else torch.full_like(new, 1.0 / len(new))


@torch.no_grad()
def validation_error(
    model: torch.nn.Module, data: SplitView, batch_size: int, metric: GapMetric = "loss"
) -> float:
    """What a generalization gap compares, lower is better: the mean cross-entropy of
    ``model`` (eval mode) over a labeled split, or its error rate 1 − accuracy."""
    model.eval()
    total, count = 0.0, 0
    for x, y in data.batches(batch_size, shuffle=False):
        logits = model(x)
        if metric == "loss":
            total += float(F.cross_entropy(logits, y, reduction="sum"))
        else:
            total += float((logits.argmax(dim=1) != y).sum())
        count += len(y)
    return total / max(count, 1)


class FedGA(FedAvg):
    """FedAvg (or FedProx) whose aggregation weights follow the clients' generalization gaps.

    Each round a client receives θ^t and, if it trained before, reports its gap
    G_k = L_k(θ^t) − L_k(θ_k^t): the loss of the received global model minus the loss of its
    own previous local model (remembered in ``ctx.state``), both on its local validation
    split (the training split when it has none). It then trains as FedAvg/FedProx and
    remembers L_k(θ_k^{t+1}). The server moves the weights towards clients with larger gaps,
    a^{t+1} = GA(a^t, G, d_t) (:func:`ga_update`), d_t = (1 − t/T)·d, and aggregates
    θ^{t+1} = Σ a_k θ_k^{t+1} over the clients of the round (their weights renormalized).
    The weights start uniform (1/K, as in the official code) and live in the server state.

    Deviation notes:

    * The official code (``variant=official``) does not centre the gaps, scales the step by
      1/3 and clips weights to [0, 1]; its step schedule d − (t−1)·d/T is taken as the
      paper's (1 − t/T)·d.
    * Normaliser and clipping of ``variant=paper``: the seed's update divides by
      max_l (G_l − μ), the largest *signed* deviation above the mean, and then only
      renormalises. fedshift divides by max_l |G_l − μ|, the absolute value the official
      ``refine_weight_dict_by_GA`` (``utils/weight_adjust.py``) takes (of uncentred gaps
      there), so no weight moves by more than d_t; and it clips at 0 before renormalising
      (the official ``weight_clip`` clips to [0, 1]), which keeps the objective's
      constraint a_k ≥ 0 that the seed's update alone does not. They differ when the
      deviation furthest below the mean is larger than the one furthest above: gaps
      (0, 3, 3) have μ = 2 and signed maximum 1, so the seed's form moves the first weight
      by −2·d_t (from 1/3 with d_t = 0.2: −0.07, a negative weight), fedshift's by −d_t.
    * The official scripts measure gaps in accuracy by default (``--fair acc``:
      G_k = acc(θ_k) − acc(θ)); the paper and the default here use the loss,
      ``gap_metric=accuracy`` gives the official form.
    * With partial participation only reporting clients' weights move (μ over them), and a
      gap may compare against a local model from an earlier round.
    """

    name = "fedga"
    paper = (
        "Zhang et al., Federated Domain Generalization with Generalization Adjustment, CVPR 2023"
    )
    Hparams = FedGAHparams
    shares = {"model": Kind.MODEL, "gap": Kind.SCALAR}
    private = False  # its other shares are not covered by DP

    def round(self, state: ServerState, fed: Federation):
        """One round:

        1. the sampled clients report their gaps G_k on θ^t and train from it;
        2. the weights of the reporting clients move by GA(a^t, G, d_t);
        3. θ^{t+1} is the weighted mean of the replies (weights renormalized over them).
        """
        everyone = fed.clients()
        weights = state.extra.get("ga_weights")
        if weights is None:
            weights = torch.full((len(everyone),), 1.0 / len(everyone), dtype=torch.float64)
        position = {cid: i for i, cid in enumerate(everyone)}
        # 1. gaps and local training
        replies = fed.call("train", fed.sample(), Record().with_arrays("model", state.model))
        reported = [cid for cid, r in replies.items() if "gap" in r.arrays]
        metrics = {"train_loss": weighted_metric(replies, "loss")}
        # 2. generalization adjustment of the weights
        if reported:
            idx = torch.tensor([position[c] for c in reported])
            gaps = torch.stack([replies[c].arrays["gap"].reshape(()) for c in reported])
            t = fed.round - 1  # the gaps measure θ^t, the model sent this round
            step = (1.0 - t / fed.total_rounds) * self.hp.step
            updated = weights.clone()
            updated[idx] = ga_update(weights[idx], gaps, step, variant=self.hp.variant) * float(
                weights[idx].sum()
            )
            weights = updated / updated.sum()
            metrics["mean_gap"] = float(gaps.mean())
        state.extra["ga_weights"] = weights
        # 3. aggregation with the adjusted weights
        if replies:
            mine = torch.stack([weights[position[c]] for c in replies])
            if float(mine.sum()) <= 0:
                mine = torch.ones_like(mine)
            state.model = self.run.aggregator(
                [r.subset("model") for r in replies.values()], mine.tolist()
            )
        return state, metrics

    def local_penalty(self, ctx: ClientContext, record: Record):
        if self.hp.base != "fedprox":
            return None
        anchor = {k: v.to(ctx.device) for k, v in record.subset("model").items()}
        return proximal_penalty(anchor, self.hp.mu)

    def reply_schema(self, task: str, sent: Record) -> ReplySchema:
        """``train``: the model back and, once the client trained before, its gap."""
        schema = super().reply_schema(task, sent)
        if task == "train":
            schema["gap"] = ArraySpec((1,), torch.float32, required=False)
        return schema

    @client_task("train")
    def train(self, ctx: ClientContext, record: Record) -> Record:
        model = model_from_record(ctx, record)
        data = ctx.val if ctx.val is not None and len(ctx.val) > 0 else ctx.train
        batch, metric = ctx.train_cfg.batch_size, self.hp.gap_metric
        remembered = f"ga_local_{metric}"
        reply = Record()
        if remembered in ctx.state:
            gap = validation_error(model, data, batch, metric) - float(ctx.state[remembered])
            reply.arrays["gap"] = torch.tensor([gap], dtype=torch.float32)
        metrics = train_supervised(model, ctx, penalty=self.local_penalty(ctx, record))
        ctx.state[remembered] = validation_error(model, data, batch, metric)
        reply.arrays.update(model_record(model).arrays)
        reply.metrics.update(metrics)
        return reply
