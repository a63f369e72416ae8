"""BD-FedProto (Xu, Xiao, Wang, 2024): FedProto with contrastive prototype aggregation (CPA)
and a dynamically adjusted global weight (DA)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from fedshift.algorithms._prototypes import prototype_arrays, prototype_loss
from fedshift.algorithms.fedproto import FedProto
from fedshift.core.context import ClientContext
from fedshift.core.errors import ConfigError
from fedshift.core.federation import Federation
from fedshift.core.hparams import BaseHparams, hp
from fedshift.core.record import Record
from fedshift.core.seeding import numpy_generator
from fedshift.core.state import ServerState


@dataclass(frozen=True)
class BDFedProtoHparams(BaseHparams):
    alpha: float = hp(
        0.5, "α", "weight of the contrastive term L_C in L_S + α·λ_D·L_C (eq. 3)", low=0
    )
    beta: float = hp(0.5, "β", "weight of the negative part L_N inside L_C (eq. 7)", low=0)
    temperature: float = hp(
        1.0, "T", "simulated-annealing temperature of the dynamic adjustment DA (eq. 6)", low=0
    )
    lambda_init: float = hp(1.0, "λ_D", "each client's weight λ_D of L_C before any adjustment")
    lambda_min: float = hp(0.1, "", "lower bound of the adjusted λ_D", low=0, low_open=True)
    lambda_max: float = hp(2.0, "", "upper bound of the adjusted λ_D")
    weighted: bool = hp(
        True,
        "",
        "weight a client's prototype by its class count (FedProto eq. 1); false: plain mean",
    )
    # the client holds no labeled prototype of other classes, hence no "all-prototypes"
    inference: Literal["own-prototypes", "head"] = hp(
        "own-prototypes",
        "",
        "how a client classifies: own-prototypes = the nearest global prototype among its own "
        "classes (FedProto's official rule), head = the classifier",
    )

    def check(self) -> None:
        if not self.lambda_min <= self.lambda_init <= self.lambda_max:
            raise ConfigError(
                "algo.lambda_min, algo.lambda_init and algo.lambda_max must satisfy "
                f"lambda_min <= lambda_init <= lambda_max; got {self.lambda_min}, "
                f"{self.lambda_init}, {self.lambda_max}"
            )


def negative_loss(
    features: torch.Tensor,
    labels: torch.Tensor,
    table: torch.Tensor | None,
    negatives: torch.Tensor | None,
) -> torch.Tensor:
    """L_N: mean over samples and negatives of exp(−d(f_i, n)), d = mean squared difference.

    The negatives of sample i are the global prototypes of the client's *other* classes
    (rows of ``table`` other than y_i) and every unlabeled prototype in ``negatives`` (the
    classes the client lacks). Each term lies in (0, 1], so L_N is bounded and its push
    vanishes once a feature is far from a negative. 0 when there is no negative.
    """
    candidates, owners = [], []
    if table is not None:
        known = ~torch.isnan(table).any(dim=1)
        candidates.append(table[known])
        owners.append(torch.nonzero(known).flatten())
    if negatives is not None and len(negatives):
        candidates.append(negatives)
        owners.append(torch.full((len(negatives),), -1, dtype=torch.long))
    if not candidates:
        return features.new_zeros(())
    bank = torch.cat(candidates).to(features.device, features.dtype)
    owner = torch.cat(owners).to(features.device)
    mask = (owner[None, :] != labels[:, None]).to(features.dtype)
    if float(mask.sum()) == 0:
        return features.new_zeros(())
    distance = (features[:, None, :] - bank[None, :, :]).pow(2).mean(-1)
    return (torch.exp(-distance) * mask).sum() / mask.sum()


def confidence(ce: float, ce_prev: float, proto: float, proto_prev: float) -> float:
    """ρ (our form of the seed's eq. 5): relative progress of L_S over that of L_P.

    ρ = (L_P / L_P^prev) / (L_S / L_S^prev), clipped to [1/2, 2]. ρ > 1 when the supervised
    loss falls faster than the prototype distance (local fitting outpaces agreement with the
    global prototypes: trust the global term more); ρ < 1 in the opposite case.
    """
    if min(ce, ce_prev, proto, proto_prev) <= 0:
        return 1.0
    rho = (proto / proto_prev) / (ce / ce_prev)
    return min(2.0, max(0.5, rho))


def anneal_lambda(
    lam: float,
    rho: float,
    round_: int,
    temperature: float,
    low: float,
    high: float,
) -> float:
    """λ_D after one round (our form of the seed's eq. 6): simulated-annealing smoothing.

    The proposal λ̃ = clip(λ·ρ, low, high) is accepted with the Metropolis weight
    a = exp(−|λ̃ − λ| / T_t) at temperature T_t = T / round, and λ moves by a·(λ̃ − λ) (the
    expected move, so the update needs no random draw). Early rounds follow the proposal;
    as T_t cools the weight freezes. λ stays in [low, high].
    """
    proposal = min(high, max(low, lam * rho))
    step = proposal - lam
    cooled = temperature / max(round_, 1)
    accept = math.exp(-abs(step) / cooled) if cooled > 0 else 0.0
    return min(high, max(low, lam + accept * step))


class BDFedProto(FedProto):
    """FedProto plus CPA and DA (seed 002); prototypes and class counts cross the wire only.

    Local objective: L = L_S + α·λ_D·L_C with L_S the cross-entropy and the contrastive
    prototype term L_C = L_P + β·L_N (eq. 7). L_P is FedProto's MSE(f(x), C̄(y)) to the
    global prototype of the sample's class; L_N (:func:`negative_loss`) pushes f(x) away
    from the global prototypes of every other class, including the classes the client does
    not hold, which the server sends as an unlabeled stack in a seeded random order (key
    ``negative``), so the client only learns "not mine". The server sends each client
    its own classes' prototypes keyed by class.

    DA: each client keeps λ_D (starting at ``lambda_init``) and the round means of L_S and
    L_P. After a round with both current and previous means it computes the confidence ρ
    (:func:`confidence`) and anneals λ_D toward λ_D·ρ at temperature T/round
    (:func:`anneal_lambda`). Round metrics add ``lambda_d`` (mean over clients) and, as
    FedProto, the MI diagnostic H(p̂) − mean_i H(p_i) per client (``mi/<client id>``).
    Prediction: the nearest of the prototypes the client holds with labels (its own
    classes; FedProto's default rule, so both are evaluated alike), or the classifier with
    ``inference="head"``.

    Deviation notes: the seed omits formulas (5), (6) and (8); the forms above are ours
    (bounded ρ ∈ [1/2, 2], λ_D ∈ [lambda_min, lambda_max], L_N ∈ [0, 1]). The seed's
    eq. (3) says α is fixed to 1 while its experiments set α = β = 0.5; we default to 0.5.
    L_P/L_N act on per-sample features (as FedProto's code), not on batch prototypes.
    With ``dp_clip`` the prototypes are released as in FedProto (every class every round,
    :func:`fedshift.core.privacy.private_prototype_mean`), so a client's negatives include
    the noise-only prototypes of classes nobody sent; ``mi/<client id>`` is not logged, and
    the logged ``lambda_d`` mean is an unnoised function of the clients' losses, outside the
    reported ε (docs/privacy.md).
    """

    name = "bd-fedproto"
    paper = (
        "Xu, Xiao, Wang, Federated prototype learning with balanced information and dynamic "
        "updating (BD-FedProto), 2024"
    )
    Hparams = BDFedProtoHparams

    def downlink(self, state: ServerState, fed: Federation) -> dict[int, Record]:
        """Per client: its own classes' prototypes by class, every other one unlabeled."""
        protos = {int(c): p for c, p in state.extra["prototypes"].items()}
        held = state.extra.get("client_classes", {})
        records = {}
        for cid in fed.clients():
            own = set(held.get(str(cid), []))
            record = Record(arrays=prototype_arrays({c: protos[c] for c in own if c in protos}))
            others = [protos[c] for c in sorted(protos) if c not in own]
            if own and others:
                order = numpy_generator(self.run.seed, "negatives", fed.round, cid).permutation(
                    len(others)
                )
                record.arrays["negative"] = torch.stack([others[i] for i in order])
            records[cid] = record
        return records

    def store_downlink(self, ctx: ClientContext, record: Record) -> None:
        super().store_downlink(ctx, record)
        if "negative" in record.arrays:
            ctx.state["negatives"] = record.arrays["negative"].clone()

    def round_metrics(self, replies, received):
        metrics = super().round_metrics(replies, received)
        values = [float(r.metrics["lambda-d"]) for r in replies.values()]
        metrics["lambda_d"] = sum(values) / len(values) if values else float("nan")
        return metrics

    def regularizer(self, ctx: ClientContext, features: torch.Tensor, labels: torch.Tensor):
        table = ctx.state.get("prototypes")
        positive = prototype_loss(features, labels, table)
        negative = negative_loss(features, labels, table, ctx.state.get("negatives"))
        contrastive = positive + self.hp.beta * negative
        weight = self.hp.alpha * float(ctx.state.get("lambda_d", self.hp.lambda_init))
        return weight * contrastive, {"proto-loss": positive, "negative-loss": negative}

    def local_prototypes(self) -> str:
        """BD-FedProto's prototypes: the eval-mode pass after training (its Hparams have no
        ``local_prototypes``)."""
        return "after-training"

    def after_training(self, ctx: ClientContext, metrics: dict[str, float]) -> dict[str, float]:
        """DA: update λ_D from this round's and the previous round's L_S and L_P means."""
        hp = self.hp
        lam = float(ctx.state.get("lambda_d", hp.lambda_init))
        ce, proto = metrics.get("ce-loss", 0.0), metrics.get("proto-loss", 0.0)
        has_proto = "prototypes" in ctx.state and proto > 0
        if has_proto and "prev_proto_loss" in ctx.state:
            rho = confidence(ce, ctx.state["prev_ce_loss"], proto, ctx.state["prev_proto_loss"])
            lam = anneal_lambda(lam, rho, ctx.round, hp.temperature, hp.lambda_min, hp.lambda_max)
        ctx.state["lambda_d"] = lam
        ctx.state["prev_ce_loss"] = ce
        if has_proto:
            ctx.state["prev_proto_loss"] = proto
        return {"lambda-d": lam}
