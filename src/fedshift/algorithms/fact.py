"""FACT: Federated Adversarial Cross Training (Schrod et al., 2023)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.toolkit import fit, state_dict_cpu, weighted_metric
from fedshift.core.algorithm import Algorithm, client_task, local_metrics
from fedshift.core.context import ClientContext
from fedshift.core.errors import ConfigError
from fedshift.core.federation import Federation
from fedshift.core.hparams import BaseHparams, hp
from fedshift.core.record import Kind, Record
from fedshift.core.reduce import mean
from fedshift.core.schema import ReplySchema, specs_of
from fedshift.core.state import ServerState

Tensors = dict[str, torch.Tensor]
Batches = Callable[[], Iterable[tuple[torch.Tensor, Any]]]
Evaluation = Literal["ensemble", "average"]
HeadOutput = Literal["logits", "probabilities"]


@dataclass(frozen=True)
class FACTHparams(BaseHparams):
    lr: float = hp(
        0.005,
        "η₀",
        "initial learning rate; replaces the run's lr (official Digit-Five / Office scripts)",
        low=0,
        low_open=True,
    )
    lr_decay: float = hp(
        0.75, "β", "exponent of the schedule η = η₀·(1 + 10·p)^(−β) (Ganin et al.)", low=0
    )
    batch_size: int = hp(
        128, "B", "batch size; replaces the run's batch_size (official scripts)", low=2
    )
    finetune_epochs: int = hp(
        1, "", "epochs of head fine-tuning F_si on the aggregated G' (official 1)", low=1
    )
    evaluate_with: Evaluation = hp(
        "ensemble",
        "",
        "how the global model classifies: ensemble = per sample the more confident of F1, F2 "
        "(official evaluation); average = the averaged head F used for the next round",
    )
    adapt_target: bool = hp(
        True,
        "",
        "run step (4), the target's IDD minimization; false is an ablation: FACT's source "
        "schedule without adaptation (the global G is then G')",
    )
    head_output: HeadOutput = hp(
        "logits",
        "",
        "what CE and IDD are applied to: the heads' logits (the paper's losses), or "
        "probabilities: the softmax outputs the official heads end in",
    )


def inter_domain_distance(logits_1: torch.Tensor, logits_2: torch.Tensor) -> torch.Tensor:
    """IDD = mean over samples and classes of |softmax(F1(G(x))) − softmax(F2(G(x)))|."""
    return (F.softmax(logits_1, dim=1) - F.softmax(logits_2, dim=1)).abs().mean()


def scheduled_lr(lr0: float, epochs_done: int, total_epochs: int, decay: float) -> float:
    """η = η₀·(1 + 10·p)^(−decay) with p = epochs_done / total_epochs (the official scheduler)."""
    progress = epochs_done / max(total_epochs, 1)
    return lr0 * (1.0 + 10.0 * progress) ** (-decay)


def split_generator_head(state: Mapping[str, torch.Tensor]) -> tuple[Tensors, Tensors]:
    """A FedModel state dict -> (G = ``backbone.*`` entries, F = ``head.*`` entries)."""
    generator = {k: v for k, v in state.items() if k.startswith("backbone.")}
    head = {k: v for k, v in state.items() if k.startswith("head.")}
    if len(generator) + len(head) != len(state):
        stray = sorted(set(state) - set(generator) - set(head))
        raise ValueError(f"FACT needs a backbone/head model; unexpected keys: {stray[:3]}")
    return generator, head


def aggregate_generators(generators: Sequence[Tensors]) -> Tensors:
    """Unweighted mean of generators (BatchNorm buffers included), as the official server
    does (weights [1, 1]): the two sources' G_s1, G_s2 -> G', the targets' G_t -> new G."""
    return mean(generators)


def average_heads(heads: Sequence[Tensors]) -> Tensors:
    """The next round's global head: unweighted mean of the (fine-tuned) source heads."""
    return mean(heads)


def _without_prefix(tensors: Mapping[str, torch.Tensor], prefix: str) -> Tensors:
    cut = len(prefix)
    return {k[cut:]: v for k, v in tensors.items() if k.startswith(prefix)}


def more_confident_head(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """Per sample, the logits of the head with the larger maximum softmax probability (the
    first one on ties), as the official ``CombinedOutcomeHeadsModel`` compares its heads'
    softmax outputs."""
    top_1 = F.softmax(first, dim=1).max(dim=1).values
    top_2 = F.softmax(second, dim=1).max(dim=1).values
    return torch.where((top_1 >= top_2)[:, None], first, second)


def head_outputs(logits: torch.Tensor, form: str) -> torch.Tensor:
    """What FACT's losses see: the logits, or (``probabilities``, the official heads' last
    layer) their softmax."""
    return F.softmax(logits, dim=1) if form == "probabilities" else logits


class TwoHeadModel(nn.Module):
    """G with two heads; per sample, the logits of the more confident head
    (:func:`more_confident_head`): how the official code scores the target."""

    def __init__(self, model: nn.Module, second_head: nn.Module):
        super().__init__()
        self.model = model
        self.second_head = second_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.model.features(x)
        return more_confident_head(self.model.classifier(features), self.second_head(features))


class FACT(Algorithm):
    """Federated Adversarial Cross Training for an unlabeled target client (protocol msst).

    Each round: (1) two randomly chosen source clients are cross-initialized with the global
    (G, F) — G = the model's ``backbone``, F = its ``head`` — and train both with cross-entropy
    for E local epochs; (2) the server averages their generators into G'; (3) each of the two
    sources fine-tunes its own head on the frozen G' (an extra transfer of G' down to both
    sources — the communication cost FACT-NF avoids); (4) the target client receives G' and
    both heads and minimizes the inter-domain distance IDD = mean |softmax(F1(G(x_t))) −
    softmax(F2(G(x_t)))| with respect to G only (heads in training mode, as the official
    code: their BN statistics adapt to the target, their weights do not step), and returns
    G_t with both heads; (5) G_t becomes the new global G and the two heads the target
    returned are averaged into the new global F. The round's IDD (mean over
    the target's batches) is reported as ``selection_score``: the summary's
    ``target_accuracy_min_idd`` is the target accuracy of the round with minimal IDD, FACT's
    label-free model selection. ``algo.adapt_target=false`` skips step (4) — an ablation
    that separates what the adaptation adds from what FACT's source schedule (two sources
    per round, its own learning rate and batch size) costs against plain FedAvg.

    Optimization follows the official code: SGD (run-level ``momentum``, ``weight_decay``;
    official 0.9 and 5e-4, fedshift's defaults), learning rate η₀·(1 + 10·p)^(−0.75) where p
    counts the epochs *this client* has trained so far over E·T (each client steps its own
    scheduler once per local epoch; the fine-tuning step uses the source's already-decayed
    rate). FACT's own ``algo.lr`` (0.005) and ``algo.batch_size`` (128) replace the run-level
    ``lr`` / ``batch_size``, which FACT ignores; ``local_epochs`` is E (official 1).

    Deviation notes: (a) the official clients keep one SGD optimizer for the whole run, so
    momentum buffers survive across rounds although the weights are re-initialized from the
    server; here each client task starts a fresh optimizer (no momentum carried over).
    (b) none any more for the target step: as in the official code the target runs G and both
    heads in training mode (dropout active, the heads' BatchNorm statistics adapting to the
    target; only G's parameters step), returns G_t with both heads, and the new global F is
    the mean of the heads the target returned — their parameters as sent, their BN
    statistics the target's. (Until 2026-11-26 the heads ran frozen in eval mode and only G_t
    came back; with the multi-layer head of ``fact-cnn`` that changed the generator's update,
    the IDD that drives min-IDD selection and the BN statistics that score the target.)
    (c) The official evaluation script skips the first ``int(0.1·epochs)`` rounds when
    taking the minimum IDD — 0 with its epochs=1 — so min-IDD selection here considers
    every evaluated round. (d) With fewer than two sources replying (failure policy), the
    round keeps the previous global model.
    (e) The official heads end in a Softmax, and its cross-entropy and IDD take those
    probabilities: CE is applied to a softmax of probabilities and the IDD compares
    softmax(softmax(·)), whose values stay within a factor e of uniform, so the official
    gradients are much flatter (an outside reading puts the IDD gradient ~7× below the
    logits form) and its learning rate 0.005 is tuned for them. Here the heads return logits
    and CE/IDD take the logits (the paper's losses); ``algo.head_output=probabilities``
    applies them to the softmax outputs as the official code does.

    Model: the default is ``fact-cnn``, the official Digit-Five split (G = two conv blocks,
    each head F = the three-layer MLP 8192 → 3072 → 100 → classes with BatchNorm and
    dropout), so the target's IDD step updates only the conv blocks and fine-tuning adapts
    the whole MLP. Any other ``--model`` takes G = its backbone and F = its head (e.g.
    ``digit5-cnn``: G = three convs + fc1 + fc2, F = one linear layer; before ``fact-cnn``
    existed FACT ran on the run's model, ``cnn`` unless given).
    The target is scored per sample with the head whose softmax maximum is larger
    (``evaluate_with=ensemble``, the official ``CombinedOutcomeHeadsModel``).
    """

    name = "fact"
    paper = "Schrod et al., FACT: Federated Adversarial Cross Training, arXiv:2306.00607, 2023"
    Hparams = FACTHparams
    shares = {"model": Kind.MODEL, "heads": Kind.MODEL}
    protocols = ("msst",)
    default_model = "fact-cnn"
    selection = "min_idd"
    selection_lower_is_better = True
    #: run the source head fine-tuning step (FACT); FACT-NF skips it
    finetune = True

    # -- server --------------------------------------------------------------------------
    def check_scenario(self, scenario: Any) -> None:
        """FACT averages exactly two sources' models a round: no robust rule applies to two
        items (a median of two is their mean, Krum needs five), so only ``mean`` runs."""
        if not self.run.aggregator.is_mean:
            raise ConfigError(
                f"fact combines exactly two sources per round; aggregator="
                f"{self.run.aggregator.name} needs more clients (use aggregator=mean)"
            )

    def round(self, state: ServerState, fed: Federation):
        """One round (the steps of the class docstring):

        1. two sampled sources train G and F from the global model;
        2. the server averages their generators into G';
        3. each source fine-tunes its head on G' (FACT-NF skips this);
        4. the target minimizes the IDD of the two heads w.r.t. G (unless
           ``adapt_target=false``);
        5. G_t (or G') and the mean of the two heads (as the target returned them, else as
           the sources sent them) become the global model.
        """
        if len(fed.clients("source")) < 2 or not fed.clients("target"):
            raise RuntimeError("FACT needs at least two source clients and a target client")
        # 1. cross-initialized source training
        ids = fed.sample(k=2)
        send = Record(config={"send_head": not self.finetune}).with_arrays("model", state.model)
        trained = fed.call("train", ids, send)
        metrics = {"train_loss": weighted_metric(trained, "loss")}
        if len(trained) < 2:
            return state, metrics
        # 2. generator averaging
        pair = list(trained)
        generators = [split_generator_head(trained[c].subset("model"))[0] for c in pair]
        aggregated = aggregate_generators(generators)
        # 3. head fine-tuning on G'
        if self.finetune:
            tuned = fed.call("finetune", pair, Record().with_arrays("model", aggregated))
            if len(tuned) < 2:
                return state, metrics
            heads = [split_generator_head(tuned[c].subset("model"))[1] for c in pair]
            metrics["finetune_loss"] = weighted_metric(tuned, "loss")
        else:
            heads = [split_generator_head(trained[c].subset("model"))[1] for c in pair]
        # 4. IDD minimization on the target
        generator = aggregated
        if self.hp.adapt_target:
            to_target = Record().with_arrays("model", aggregated)
            to_target.with_arrays("heads.0", heads[0]).with_arrays("heads.1", heads[1])
            adapted = fed.call("idd", fed.clients("target"), to_target)
            if not adapted:
                return state, metrics
            generator = aggregate_generators([r.subset("model") for r in adapted.values()])
            heads = [  # the heads as the target returned them: its BN statistics
                mean([r.subset(f"heads.{i}") for r in adapted.values()]) for i in (0, 1)
            ]
            idd = sum(float(r.metrics["idd"]) for r in adapted.values()) / len(adapted)
            metrics.update(idd=idd, selection_score=idd)
        # 5. the new global model
        state.model = {**generator, **average_heads(heads)}
        state.extra["heads"] = heads
        return state, metrics

    def global_model(self, state: ServerState) -> nn.Module | None:
        model = super().global_model(state)
        if model is None or self.hp.evaluate_with == "average" or "heads" not in state.extra:
            return model
        first, second = state.extra["heads"]
        model.head.load_state_dict(_without_prefix(first, "head."))
        second_head = copy.deepcopy(model.head)
        second_head.load_state_dict(_without_prefix(second, "head."))
        return TwoHeadModel(model, second_head)

    # -- clients -------------------------------------------------------------------------
    def _lr(self, ctx: ClientContext) -> float:
        total = ctx.train_cfg.local_epochs * ctx.total_rounds
        return scheduled_lr(
            self.hp.lr, int(ctx.state.get("epochs_done", 0)), total, self.hp.lr_decay
        )

    def _sgd(self, params, ctx: ClientContext) -> torch.optim.Optimizer:
        cfg = ctx.train_cfg
        return torch.optim.SGD(
            params, lr=self._lr(ctx), momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )

    def _scheduled(
        self, ctx: ClientContext, optimizer: torch.optim.Optimizer, batches: Batches
    ) -> Batches:
        """``batches`` for :func:`fit` that first set the epoch's learning rate and, once
        the epoch is through, count it in this client's schedule."""

        def epoch():
            for group in optimizer.param_groups:
                group["lr"] = self._lr(ctx)
            yield from batches()
            ctx.state["epochs_done"] = int(ctx.state.get("epochs_done", 0)) + 1

        return epoch

    def reply_schema(self, task: str, sent: Record) -> ReplySchema:
        """``train``: G and (unless kept on the client) F; ``finetune``: F only; ``idd``: G
        and both heads, as sent (the default echo of the MODEL shares)."""
        if task not in ("train", "finetune"):
            return super().reply_schema(task, sent)
        if not hasattr(self, "_parts"):
            with torch.random.fork_rng(devices=[]):  # off the run's random streams
                generator, head = split_generator_head(self.build_net().state_dict())
            self._parts = specs_of(generator, "model"), specs_of(head, "model")
        generator, head = self._parts
        if task == "finetune":
            return dict(head)
        return {**generator, **head} if sent.config.get("send_head", True) else dict(generator)

    @client_task("train")
    def train(self, ctx: ClientContext, record: Record) -> Record:
        """Source training: CE on (G, F) from the global model, E epochs."""
        model = ctx.build_model()
        model.load_state_dict(record.subset("model"))
        model.to(ctx.device).train()
        optimizer = self._sgd(model.parameters(), ctx)
        sums, seen = fit(
            optimizer,
            ctx.train_cfg.local_epochs,
            self._scheduled(ctx, optimizer, lambda: ctx.train.batches(self.hp.batch_size, ctx.rng)),
            lambda x, y: F.cross_entropy(head_outputs(model(x), self.hp.head_output), y),
            precision=ctx.precision,
        )
        generator, head = split_generator_head(state_dict_cpu(model))
        reply = Record().with_arrays("model", generator)
        if record.config.get("send_head", True):
            reply.with_arrays("model", head)
        else:
            ctx.state["head"] = head
        reply.metrics.update(local_metrics(ctx, seen, **sums))
        return reply

    @client_task("finetune")
    def finetune_head(self, ctx: ClientContext, record: Record) -> Record:
        """Fit this source's own head to the aggregated generator G' (G' frozen)."""
        model = ctx.build_model()
        head = ctx.state.pop("head", None)
        if head is None:
            raise RuntimeError("finetune called before train on this client")
        model.load_state_dict({**record.subset("model"), **head})
        model.to(ctx.device).train()
        for param in model.backbone.parameters():
            param.requires_grad_(False)
        sums, seen = fit(
            self._sgd(model.head.parameters(), ctx),
            self.hp.finetune_epochs,
            lambda: ctx.train.batches(self.hp.batch_size, ctx.rng),
            lambda x, y: F.cross_entropy(
                head_outputs(model.classifier(model.features(x)), self.hp.head_output), y
            ),
            precision=ctx.precision,
        )
        _, head = split_generator_head(state_dict_cpu(model))
        reply = Record().with_arrays("model", head)
        reply.metrics.update(local_metrics(ctx, seen, **sums))
        return reply

    @client_task("idd")
    def minimize_idd(self, ctx: ClientContext, record: Record) -> Record:
        """Target step, as the official client: G and both heads in training mode on the
        unlabeled target data, SGD on G's parameters only to minimize the IDD; replies G_t
        and both heads (their BatchNorm statistics now the target's)."""
        model = ctx.build_model()
        model.load_state_dict({**record.subset("model"), **record.subset("heads.0")})
        second_head = copy.deepcopy(model.head)
        second_head.load_state_dict(_without_prefix(record.subset("heads.1"), "head."))
        model.to(ctx.device).train()
        second_head.to(ctx.device).train()
        for param in [*model.head.parameters(), *second_head.parameters()]:
            param.requires_grad_(False)
        optimizer = self._sgd(model.backbone.parameters(), ctx)
        idd_total, idd_batches = 0.0, 0

        def idd_loss(x: torch.Tensor, _) -> torch.Tensor:
            nonlocal idd_total, idd_batches
            features = model.features(x)
            form = self.hp.head_output
            loss = inter_domain_distance(
                head_outputs(model.classifier(features), form),
                head_outputs(second_head(features), form),
            )
            idd_total += float(loss.detach())  # the reported IDD is the mean over batches
            idd_batches += 1
            return loss

        _, seen = fit(
            optimizer,
            ctx.train_cfg.local_epochs,
            self._scheduled(
                ctx,
                optimizer,
                lambda: ctx.train.batches(self.hp.batch_size, ctx.rng, labels=False),
            ),
            idd_loss,
            precision=ctx.precision,
        )
        generator, first = split_generator_head(state_dict_cpu(model))
        second = {f"head.{k}": v for k, v in state_dict_cpu(second_head).items()}
        reply = Record().with_arrays("model", generator)
        reply.with_arrays("heads.0", first).with_arrays("heads.1", second)
        reply.metrics.update(local_metrics(ctx, seen), idd=idd_total / max(idd_batches, 1))
        return reply
