"""MOON: model-contrastive federated learning (Li, He and Song, CVPR 2021)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.toolkit import averaging_round, fit, make_optimizer, state_dict_cpu
from fedshift.core.algorithm import Algorithm, client_task, local_metrics
from fedshift.core.context import ClientContext
from fedshift.core.federation import Federation
from fedshift.core.hparams import BaseHparams, hp, log_uniform, uniform
from fedshift.core.record import Kind, Record
from fedshift.core.seeding import derive_seed
from fedshift.core.state import ServerState
from fedshift.models.base import FedModel


@dataclass(frozen=True)
class MoonHparams(BaseHparams):
    mu: float = hp(
        1.0,
        "μ",
        "weight of the model-contrastive loss ℓ_con (paper: 1; 5 on CIFAR-10)",
        low=0,
        search=log_uniform(0.1, 10.0),
    )
    temperature: float = hp(
        0.5,
        "τ",
        "temperature of the cosine similarities in ℓ_con",
        low=0,
        low_open=True,
        search=uniform(0.1, 1.0),
    )
    proj_dim: int = hp(256, "", "output size of the projection head h (official out_dim)", low=1)
    classify_projection: bool = hp(
        True, "", "output layer on h(f(x)) as in paper and code; false: on f(x)"
    )


class MoonNet(FedModel):
    """A backbone with MOON's projection head ``h = Linear(d, d) -> ReLU -> Linear(d, proj_dim)``.

    With ``classify_projection`` the output layer reads the projection (the paper's network:
    base encoder, projection head, output layer), so :meth:`features` is ``h(f(x))``;
    otherwise the backbone's own head reads ``f(x)`` and the projection only feeds ℓ_con.
    The head is part of the model and averaged with it.
    """

    def __init__(self, base: FedModel, proj_dim: int, classify_projection: bool):
        head = nn.Linear(proj_dim, base.num_classes) if classify_projection else base.head
        super().__init__(
            base.backbone,
            head,
            embed_dim=proj_dim if classify_projection else base.embed_dim,
            num_classes=base.num_classes,
            arch=f"{base.arch}+moon",
        )
        width = base.embed_dim
        self.projection = nn.Sequential(
            nn.Linear(width, width), nn.ReLU(), nn.Linear(width, proj_dim)
        )
        self.classify_projection = classify_projection

    def represent(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The projection ``z`` (what ℓ_con compares) and the logits."""
        h = self.backbone(x)
        z = self.projection(h)
        return z, self.head(z if self.classify_projection else h)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        h = self.backbone(x)
        return self.projection(h) if self.classify_projection else h


def model_contrastive_loss(
    z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor | None, temperature: float
) -> torch.Tensor:
    """ℓ_con = −log(e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} + e^{sim(z, z_prev)/τ})),
    cosine similarity, mean over the batch.

    Without a previous model (a client's first round) only the positive pair is left and the
    loss is log(1) = 0, as in the official code whose model pool starts empty.
    """
    logits = [F.cosine_similarity(z, z_glob, dim=-1)]
    if z_prev is not None:
        logits.append(F.cosine_similarity(z, z_prev, dim=-1))
    logits = torch.stack(logits, dim=1) / temperature
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


class Moon(Algorithm):
    """MOON: local loss CE + μ·ℓ_con, where ℓ_con pulls the projection z of the model being
    trained towards z_glob of the received global model and pushes it from z_prev of the
    client's own previous local model; the server takes FedAvg's sample-weighted mean of the
    whole network (backbone, projection head, output layer; BatchNorm buffers included).

    The previous local model lives in ``ctx.state["previous_model"]`` (checkpointed), replaced
    after each local training, so a client that skips rounds contrasts with the last model it
    trained, as the official code's per-client ``old_nets`` do.

    Deviation notes:
    - The projection head is fedshift's addition on top of any backbone: ``Linear(d, d) ->
      ReLU -> Linear(d, 256)`` as in the official ``ModelFedCon`` (d = backbone embed_dim);
      its initialization is seeded separately from the backbone's.
    - The official code keeps a buffer of previous models (``model_buffer_size``, default 1);
      only the default buffer of one is implemented.
    - As in the official code, z_glob and z_prev come from frozen models in eval mode
      (BatchNorm running statistics), and a client's first round has no negative (ℓ_con = 0).
    - Local epochs, learning rate and weight decay are the run's (paper: 10 epochs, lr 0.01,
      weight decay 1e-5); the optimizer is rebuilt every round.
    """

    name = "moon"
    paper = "Li, He and Song, Model-Contrastive Federated Learning, CVPR 2021"
    Hparams = MoonHparams
    shares = {"model": Kind.MODEL}
    private = True

    def build_net(self) -> MoonNet:
        """The backbone plus a projection head whose init depends only on the run seed."""
        base = self.run.build_model()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.run.seed, "moon-projection"))
            return MoonNet(base, self.hp.proj_dim, self.hp.classify_projection)

    def round(self, state: ServerState, fed: Federation):
        return averaging_round(
            state,
            fed,
            self.run.aggregator,
            {"train_loss": "loss", "contrastive_loss": "contrastive"},
            privacy=self.run.privacy,
            seed=self.run.seed,
        )

    def _frozen(self, weights: dict[str, Any], device: torch.device) -> MoonNet:
        model = self.build_net()
        model.load_state_dict(weights)
        model.to(device).eval()
        for param in model.parameters():
            param.requires_grad_(False)
        return model

    @client_task("train")
    def train(self, ctx: ClientContext, record: Record) -> Record:
        cfg, device = ctx.train_cfg, ctx.device
        received = record.subset("model")
        global_net = self._frozen(received, device)
        previous = ctx.state.get("previous_model")
        previous_net = self._frozen(previous, device) if previous is not None else None
        model = self.build_net()
        model.load_state_dict(received)
        model.to(device).train()

        def step_loss(x: torch.Tensor, y: torch.Tensor):
            z, logits = model.represent(x)
            with torch.no_grad():
                z_glob = global_net.represent(x)[0]
                z_prev = previous_net.represent(x)[0] if previous_net is not None else None
            contrastive = model_contrastive_loss(z, z_glob, z_prev, self.hp.temperature)
            loss = F.cross_entropy(logits, y) + self.hp.mu * contrastive
            return loss, {"contrastive": contrastive}

        sums, seen = fit(
            make_optimizer(model.parameters(), cfg),
            cfg.local_epochs,
            lambda: ctx.train.batches(cfg.batch_size, ctx.rng),
            step_loss,
            terms=("contrastive",),
            precision=ctx.precision,
        )
        ctx.state["previous_model"] = state_dict_cpu(model)
        reply = Record().with_arrays("model", state_dict_cpu(model))
        reply.metrics.update(local_metrics(ctx, seen, **sums))
        return reply
