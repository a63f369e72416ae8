"""FedProto (Tan et al., AAAI 2022): federated prototype learning across heterogeneous clients."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from fedshift.algorithms._prototypes import (
    PrototypeModel,
    accumulate_class_sums,
    aggregate_prototypes,
    class_means,
    local_statistics,
    nearest_prototype_scores,
    prototype_arrays,
    prototype_loss,
    prototypes_from_arrays,
    stack_prototypes,
)
from fedshift.algorithms.toolkit import fit, make_optimizer, state_dict_cpu, weighted_metric
from fedshift.core.algorithm import Algorithm, client_task, local_metrics
from fedshift.core.context import ClientContext
from fedshift.core.federation import Federation
from fedshift.core.hparams import BaseHparams, hp, log_uniform
from fedshift.core.privacy import private_prototype_mean, withhold_and_clip_prototypes
from fedshift.core.record import Kind, Record
from fedshift.core.schema import ReplySchema, class_names, family
from fedshift.core.seeding import torch_generator
from fedshift.core.state import ServerState
from fedshift.eval.metrics import accuracy

Inference = Literal["own-prototypes", "all-prototypes", "head"]
LocalPrototypes = Literal["after-training", "training-batches"]


@dataclass(frozen=True)
class FedProtoHparams(BaseHparams):
    proto_weight: float = hp(
        1.0,
        "λ",
        "weight of the distance to the global prototypes (ld; 0.1 on CIFAR-10)",
        low=0,
        search=log_uniform(0.1, 10.0),
    )
    weighted: bool = hp(
        True, "", "weight C_k(c) by the class count |D_{k,c}| (eq. 1); false: official plain mean"
    )
    inference: Inference = hp(
        "own-prototypes",
        "",
        "how a client classifies: own-prototypes = nearest global prototype among its own "
        "classes (official code); all-prototypes = among every global prototype (eq. 5); "
        "head = the classifier",
    )
    local_prototypes: LocalPrototypes = hp(
        "after-training",
        "",
        "how a client computes its prototypes: after-training = one eval-mode pass over its "
        "training split after local training (eq. 2); training-batches = the training-mode "
        "features of the last local epoch's batches, as they are trained on (official code)",
    )


class FedProto(Algorithm):
    """Clients exchange class prototypes only; every model stays on its client.

    Client k keeps its own model (``ctx.state["model"]``; architectures may differ, e.g. the
    run option ``hetero_models=fedproto``, as long as the embedding size is shared). Each
    round it trains E local epochs on CE(g(f(x)), y) + λ·MSE(f(x), C̄(y)) (eq. 4, the distance
    of eq. 3 realised per sample as in the official code; no prototype term in round 1), then
    sends its prototypes C_k(c) = mean f(x) over its class-c samples (eq. 2) with the class
    counts |D_{k,c}|. The server averages them per class over the clients that hold the class:
    weighted by |D_{k,c}| (eq. 1, ``weighted=True``) or unweighted (official code,
    ``weighted=False``), and sends the global table back to all clients in the same round
    (task ``receive``), so the evaluated client models always carry the newest C̄. Prediction
    is the nearest global prototype among the classes the client holds,
    argmin_{c ∈ C_k} ‖f(x) − C̄(c)‖² (``inference="own-prototypes"``, the official code's
    ``test_inference_new_het_lt``, the default, and BD-FedProto's rule);
    ``inference="all-prototypes"`` is the paper's eq. 5 over every class, ``"head"`` the
    client's classifier. The round metrics report the prototype rule and the head on each
    client's own test share (``proto_accuracy``, ``head_accuracy``), the prototype term
    (``proto_loss``) and seed 002's MI diagnostic (``mi_mean``, ``mi/<client id>``).

    Deviation notes:

    * Local prototypes are computed after local training in eval mode, in one pass over the
      whole training split (eq. 2 on the trained model, dropout off;
      ``local_prototypes="after-training"``, the default). The official
      ``LocalUpdate.update_weights_het`` (``lib/update.py``) collects training-mode
      features batch by batch while it trains (each before that batch's update, dropout
      on), but empties its per-class lists at the start of every local epoch, so only the
      last local epoch's batches count (``train_ep`` defaults to 1; its loader drops the
      last incomplete batch); ``agg_func`` (``lib/utils.py``) averages them per class.
      ``local_prototypes="training-batches"`` does that (every trained batch of the last
      epoch; a batch of one sample is skipped, not the last incomplete batch).
    * Eq. 1 normalisation: as printed, C̄(c) = (1/|𝒩_c|)·Σ_{k∈𝒩_c} (|D_{k,c}|/N_c)·C_k(c),
      with 𝒩_c the set of clients holding c and N_c the class-c sample total; the count
      weights already sum to one, so read literally the extra 1/|𝒩_c| shrinks C̄(c) by the
      number of holders. ``weighted=True`` (default) takes the count-weighted mean
      Σ_k |D_{k,c}|·C_k(c) / Σ_k |D_{k,c}| without that factor; the official
      ``proto_aggregation`` (``lib/utils.py``) ignores the counts and takes the plain mean
      over the holders (``weighted=False``).
    * Classes no client sampled this round keep their previous global prototype (only matters
      with ``fraction < 1``); the official code always has every client take part.
    * Optimizer, learning rate, batch size and local epochs are the run's (``lr`` 0.01 as in
      the paper; the official code uses SGD with momentum 0.5 and batch size 4).
    * Every client starts from the same seeded weights by default (``client_init=shared``,
      the engine's rule for all methods). The official ``exps/federated_main.py`` builds one
      model per client, each with its own random initialization; the run key
      ``client_init=own`` does that (each client its own seeded init).
    * With ``dp_clip`` (not in the paper): clients withhold classes with fewer than
      ``dp_min_count`` examples, clip their whole set of prototypes jointly to norm
      ``dp_clip`` (all classes as one vector) and send ``dp_min_count`` as every count; the
      server re-clips each set jointly and releases every class every round as the sum of the
      sent prototypes plus Gaussian noise, divided by the number of clients sampled
      (:func:`fedshift.core.privacy.private_prototype_mean`; a class nobody sent is noise
      alone), so ``weighted`` has no effect, a class held by few clients is shrunk towards 0,
      and no class keeps its previous prototype. The per-client ``mi/<client id>`` metrics are
      not logged.
    """

    name = "fedproto"
    paper = (
        "Tan et al., FedProto: Federated Prototype Learning across Heterogeneous Clients, AAAI 2022"
    )
    Hparams = FedProtoHparams
    shares = {"prototype": Kind.PROTOTYPE, "count": Kind.COUNT}
    personal = True
    private = True

    # -- server ----------------------------------------------------------------------------
    def init_state(self) -> ServerState:
        return ServerState(extra={"prototypes": {}})

    def round(self, state: ServerState, fed: Federation):
        """1. The sampled clients train their own models and reply with their prototypes and
        class counts; 2. the server averages them per class into the global table (without
        DP, classes nobody sent keep their prototype; with DP, every class is released anew)
        and notes which classes each client holds; 3. every client receives its downlink and
        scores its model on its own test share."""
        # 1. local training
        sampled = fed.sample()
        replies = fed.call("train", sampled, Record())
        # 2. global prototypes (eq. 1)
        tables = [prototypes_from_arrays(r.arrays) for r in replies.values()]
        privacy = self.run.privacy
        if privacy is None:
            fresh = aggregate_prototypes(
                [t[0] for t in tables],
                [t[1] for t in tables],
                self.hp.weighted,
                self.run.aggregator,
            )
        else:
            fresh = private_prototype_mean(
                [t[0] for t in tables],
                privacy.clip,
                privacy.noise_multiplier,
                torch_generator(self.run.seed, "dp-noise", fed.round),
                num_classes=self.run.num_classes,
                dim=self.embedding_dim,
                denominator=len(sampled),
            )
        merged = {int(c): p for c, p in state.extra["prototypes"].items()}
        merged.update(fresh)
        state.extra["prototypes"] = {str(c): merged[c] for c in sorted(merged)}
        state.extra["client_classes"] = {
            **state.extra.get("client_classes", {}),
            **{str(cid): sorted(t[1]) for cid, t in zip(replies, tables, strict=True)},
        }
        # 3. downlink to every client, evaluated there
        received = fed.call("receive", fed.clients(), self.downlink(state, fed))
        return state, self.round_metrics(replies, received)

    def downlink(self, state: ServerState, fed: Federation) -> Record | dict[int, Record]:
        """What each client receives after aggregation: the whole labeled global table."""
        protos = {int(c): p for c, p in state.extra["prototypes"].items()}
        return Record(arrays=prototype_arrays(protos))

    @property
    def embedding_dim(self) -> int:
        """The run's embedding size (every client model shares it), from a model built once
        off the run's random streams."""
        if not hasattr(self, "_embedding_dim"):
            with torch.random.fork_rng(devices=[]):
                self._embedding_dim = int(self.run.build_model().embed_dim)
        return self._embedding_dim

    def round_metrics(self, replies: dict[int, Record], received: dict[int, Record]):
        """Round means of the clients' losses, accuracies and MI; per-client MI
        (``mi/<client id>``) only without differential privacy, as it is an unnoised
        function of one client's data."""
        metrics = {
            "train_loss": weighted_metric(replies, "loss"),
            "ce_loss": weighted_metric(replies, "ce-loss"),
            "proto_loss": weighted_metric(replies, "proto-loss"),
            "proto_accuracy": _plain_mean(received, "proto-accuracy"),
            "head_accuracy": _plain_mean(received, "head-accuracy"),
            "mi_mean": _plain_mean(replies, "mi"),
        }
        if self.run.privacy is None:
            metrics.update({f"mi/{cid}": float(r.metrics["mi"]) for cid, r in replies.items()})
        return metrics

    # -- evaluation ------------------------------------------------------------------------
    def client_model(self, client_state: dict[str, Any]) -> torch.nn.Module | None:
        return self.wrap_model(self.run.build_model, client_state)

    def wrap_model(self, build, client_state: dict[str, Any]) -> PrototypeModel | None:
        """The client's network (built by ``build``) with the prototypes its inference rule
        chooses among: the last received table, cut to the client's own classes unless
        ``inference="all-prototypes"``."""
        if "model" not in client_state:
            return None
        net = build()
        net.load_state_dict(client_state["model"])
        table = client_state.get("prototypes")
        if table is None:
            table = torch.full((self.run.num_classes, net.embed_dim), float("nan"))
        elif self.hp.inference != "all-prototypes" and "classes" in client_state:
            table = only_classes(table, client_state["classes"])
        return PrototypeModel(net, table)

    def predict(self, model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.hp.inference == "head":
            return model(x)
        return predict_nearest(model, x)

    # -- client ----------------------------------------------------------------------------
    def regularizer(
        self, ctx: ClientContext, features: torch.Tensor, labels: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The global-knowledge term added to CE, and its parts for logging."""
        table = ctx.state.get("prototypes")
        distance = prototype_loss(features, labels, table)
        return self.hp.proto_weight * distance, {"proto-loss": distance}

    def local_prototypes(self) -> LocalPrototypes:
        """Where the client's prototypes come from (the hyperparameter)."""
        return self.hp.local_prototypes

    def after_training(self, ctx: ClientContext, metrics: dict[str, float]) -> dict[str, float]:
        """Hook after local training (BD-FedProto's dynamic adjustment): ``metrics`` holds the
        mean losses by name; returns metrics to add to the reply."""
        return {}

    def reply_schema(self, task: str, sent: Record) -> ReplySchema:
        """``train``: a prototype of the run's embedding size and an int64 count per class
        the client holds."""
        if task == "train":
            classes = class_names(self.run.num_classes)
            counts = family("count", (), torch.int64, names=classes, same_names_as="prototype")
            protos = family("prototype", (self.embedding_dim,), torch.float32, names=classes)
            return {**protos, **counts}
        return super().reply_schema(task, sent)

    @client_task("train")
    def train(self, ctx: ClientContext, record: Record) -> Record:
        model = ctx.build_model()
        if "model" in ctx.state:
            model.load_state_dict(ctx.state["model"])
        model.to(ctx.device).train()
        cfg = ctx.train_cfg

        # the training-mode features of the epoch being trained, per class (the official
        # prototypes when local_prototypes = "training-batches"; emptied at each epoch)
        epoch_sums: dict[int, torch.Tensor] = {}
        epoch_counts: dict[int, int] = {}
        from_batches = self.local_prototypes() == "training-batches"

        def step_loss(x: torch.Tensor, y: torch.Tensor):
            features = model.features(x)
            if from_batches:
                accumulate_class_sums(epoch_sums, epoch_counts, features.detach(), y)
            ce = F.cross_entropy(model.classifier(features), y)
            extra, parts = self.regularizer(ctx, features, y)
            return ce + extra, {"ce-loss": ce, **parts}

        def epoch_batches():
            epoch_sums.clear()
            epoch_counts.clear()
            return ctx.train.batches(cfg.batch_size, ctx.rng)

        sums, seen = fit(
            make_optimizer(model.parameters(), cfg),
            cfg.local_epochs,
            epoch_batches,
            step_loss,
            precision=ctx.precision,
        )
        metrics = local_metrics(ctx, seen, **sums)
        ctx.state["model"] = state_dict_cpu(model)
        protos, counts, mi = local_statistics(model, ctx.train, ctx.device, with_mi=True)
        if from_batches and epoch_counts:
            protos = class_means(epoch_sums, epoch_counts)
        ctx.state["classes"] = torch.tensor(sorted(protos), dtype=torch.long)
        privacy = self.run.privacy
        if privacy is not None:
            # DP: rare classes stay home, the set clipped jointly; a sent count says only
            # "at least dp_min_count", which sending the prototype already says
            protos, counts = withhold_and_clip_prototypes(
                protos, counts, privacy.clip, privacy.min_count
            )
            counts = {label: privacy.min_count for label in counts}
        reply = Record(arrays=prototype_arrays(protos, counts))
        reply.metrics.update(metrics)
        reply.metrics.update(self.after_training(ctx, metrics))
        reply.metrics["mi"] = mi
        return reply

    def store_downlink(self, ctx: ClientContext, record: Record) -> None:
        """Keep the received global prototypes as a ``(num_classes, dim)`` table."""
        protos, _ = prototypes_from_arrays(record.arrays)
        if protos:
            ctx.state["prototypes"] = stack_prototypes(protos, ctx.num_classes)

    @client_task("receive")
    def receive(self, ctx: ClientContext, record: Record) -> Record:
        self.store_downlink(ctx, record)
        reply = Record()
        if ctx.labeled and ctx.test is not None and len(ctx.test) and "model" in ctx.state:
            model = self.wrap_model(ctx.build_model, ctx.state)
            reply.metrics["proto-accuracy"] = accuracy(model, ctx.test, ctx.device, predict_nearest)
            reply.metrics["head-accuracy"] = accuracy(
                model, ctx.test, ctx.device, lambda m, x: m(x)
            )
        return reply


def only_classes(table: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """``table`` with the rows of every class outside ``classes`` set to NaN (left out of
    the nearest-prototype rule)."""
    kept = torch.full_like(table, float("nan"))
    kept[classes] = table[classes]
    return kept


def predict_nearest(model: PrototypeModel, x: torch.Tensor) -> torch.Tensor:
    """Scores of the nearest-prototype rule (eq. 5); the classifier while no prototype exists."""
    if not model.has_prototypes:
        return model(x)
    return nearest_prototype_scores(model.features(x), model.prototypes)


def _plain_mean(replies: dict[int, Record], key: str) -> float:
    values = [float(r.metrics[key]) for r in replies.values() if key in r.metrics]
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else float("nan")
