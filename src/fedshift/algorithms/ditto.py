"""Ditto (Li et al., ICML 2021): personal models regularized towards a FedAvg global model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from fedshift.algorithms.toolkit import (
    averaging_round,
    make_optimizer,
    model_from_record,
    model_record,
    optimizer_step,
    proximal_penalty,
    state_dict_cpu,
)
from fedshift.core.algorithm import Algorithm, client_task, local_metrics
from fedshift.core.context import ClientContext
from fedshift.core.federation import Federation
from fedshift.core.hparams import BaseHparams, hp, log_uniform
from fedshift.core.record import Kind, Record
from fedshift.core.state import ServerState


@dataclass(frozen=True)
class DittoHparams(BaseHparams):
    # the official run scripts use --lam=1 (the paper tunes λ in {0.01, 0.1, 1, 2} and its
    # dynamic variant picks from {0.1, 1, 2})
    lam: float = hp(
        1.0,
        "λ",
        "weight of the pull λ/2·‖v_k − θ‖² of a personal model to the global",
        low=0,
        search=log_uniform(0.01, 10.0),
    )


class Ditto(Algorithm):
    """Ditto: a FedAvg global model θ plus a personal model v_k on every client.

    Each round a sampled client receives θ and, batch by batch as in the official code,
    takes one step on its personal model with CE + λ/2·‖v_k − θ‖² (θ fixed at the received
    value) and one plain CE step on its copy of θ; the copy of θ is sent back and averaged
    (sample-size weighted, all parameters and BatchNorm buffers). v_k starts as the first θ
    the client receives and lives only in the client's state. Evaluation: θ on held-out
    domains (``target_accuracy``) and v_k on each client's own test share
    (``personalized_accuracy``).

    Deviation notes: the official TensorFlow code uses plain SGD on both models; fedshift
    uses the run's optimizer (SGD with momentum and weight decay by default) for both, each
    with its own optimizer state for the round. The proximal term covers trainable
    parameters, not BatchNorm buffers.
    """

    name = "ditto"
    paper = (
        "Li et al., Ditto: Fair and Robust Federated Learning Through Personalization, ICML 2021"
    )
    Hparams = DittoHparams
    shares = {"model": Kind.MODEL}
    private = True

    def round(self, state: ServerState, fed: Federation):
        return averaging_round(
            state,
            fed,
            self.run.aggregator,
            {"train_loss": "loss", "personal_loss": "personal_loss"},
            privacy=self.run.privacy,
            seed=self.run.seed,
        )

    def client_model(self, client_state: dict[str, Any]) -> torch.nn.Module | None:
        if "personal" not in client_state:
            return None
        model = self.run.build_model()
        model.load_state_dict(client_state["personal"])
        return model

    @client_task("train")
    def train(self, ctx: ClientContext, record: Record) -> Record:
        cfg = ctx.train_cfg
        shared = model_from_record(ctx, record)
        personal = ctx.build_model().to(ctx.device)
        personal.load_state_dict(ctx.state.get("personal", record.subset("model")))
        anchor = {k: v.to(ctx.device) for k, v in record.subset("model").items()}
        penalty = proximal_penalty(anchor, self.hp.lam)
        shared.train()
        personal.train()
        opt_shared = make_optimizer(shared.parameters(), cfg)
        opt_personal = make_optimizer(personal.parameters(), cfg)
        shared_total = personal_total = 0.0
        seen = 0
        scaler = ctx.precision.scaler()
        for _ in range(cfg.local_epochs):
            for x, y in ctx.train.batches(cfg.batch_size, ctx.rng):
                if len(x) < 2:
                    continue
                # two models, two losses per batch: one step each, personal model first
                with ctx.autocast():
                    personal_loss = F.cross_entropy(personal(x), y) + penalty(personal)
                personal_total += optimizer_step(opt_personal, personal_loss, scaler) * len(x)
                with ctx.autocast():
                    shared_loss = F.cross_entropy(shared(x), y)
                shared_total += optimizer_step(opt_shared, shared_loss, scaler) * len(x)
                seen += len(x)
        ctx.state["personal"] = state_dict_cpu(personal)
        reply = model_record(shared)
        reply.metrics.update(
            local_metrics(ctx, seen, loss=shared_total, personal_loss=personal_total)
        )
        return reply
