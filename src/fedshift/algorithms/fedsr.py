"""FedSR: simple representations for federated domain generalization (Nguyen, Torr and Lim,
NeurIPS 2022)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.algorithms.toolkit import (
    call_and_average,
    fit,
    make_optimizer,
    state_dict_cpu,
    weighted_metric,
)
from fedshift.core.algorithm import Algorithm, client_task, local_metrics
from fedshift.core.context import ClientContext
from fedshift.core.federation import Federation
from fedshift.core.hparams import BaseHparams, hp, log_uniform
from fedshift.core.record import Kind, Record
from fedshift.core.schema import ArraySpec, ReplySchema, echo
from fedshift.core.seeding import derive_seed, torch_generator
from fedshift.core.state import ServerState
from fedshift.models.base import FedModel

L2RForm = Literal["squared", "norm"]
L2R_FORMS = get_args(L2RForm)


@dataclass(frozen=True)
class FedSRHparams(BaseHparams):
    alpha_l2r: float = hp(
        0.01,
        "α^{L2R}",
        "weight of the L2 regularizer of the representation z",
        low=0,
        search=log_uniform(1e-3, 0.1),
    )
    alpha_cmi: float = hp(
        5e-4,
        "α^{CMI}",
        "weight of the conditional mutual information term (official README: 1e-3 on PACS)",
        low=0,
        search=log_uniform(1e-4, 1e-2),
    )
    z_dim: int = hp(
        0, "", "size of z; 0: the backbone's embed_dim (official: 512 with ResNet-18)", low=0
    )
    l2r: L2RForm = hp(
        "squared", "", "L2R form: squared = E‖z‖² (paper); norm = E‖z‖ (official code)"
    )
    cmi_scale: bool = hp(
        False, "", "learnable scale C on (μ, σ) inside the CMI term (official code)"
    )
    predict_samples: int = hp(
        20, "S", "z samples averaged at test time (official num_samples)", low=1
    )
    predict_with_mean: bool = hp(False, "", "classify μ instead of averaging S sampled predictions")
    share_reference: bool = hp(
        False, "", "also average the reference distribution r_μ, r_σ on the server (as prototypes)"
    )


class FedSRNet(FedModel):
    """A backbone whose features parameterize ``p(z|x) = N(μ, diag σ²)`` and a head on ``z``.

    ``posterior`` is a linear layer from the backbone's features to ``2·z_dim`` numbers: μ and
    σ = softplus(·), as the official code's ``fc`` to ``2·z_dim``. :meth:`features` is the
    mean μ (the deterministic embedding); training samples ``z`` by reparameterization.
    """

    def __init__(self, base: FedModel, z_dim: int):
        head = nn.Linear(z_dim, base.num_classes)
        super().__init__(
            base.backbone,
            head,
            embed_dim=z_dim,
            num_classes=base.num_classes,
            arch=f"{base.arch}+fedsr",
        )
        self.posterior = nn.Linear(base.embed_dim, 2 * z_dim)
        self.z_dim = z_dim

    def distribution(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(μ, σ)`` of ``p(z|x)``, each ``(N, z_dim)``."""
        mu, raw_sigma = self.posterior(self.backbone(x)).chunk(2, dim=1)
        return mu, F.softplus(raw_sigma)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.distribution(x)[0]


def l2r_penalty(z: torch.Tensor, form: str = "squared") -> torch.Tensor:
    """L2R over a batch of samples ``z``: mean ‖z‖² (paper) or mean ‖z‖ (official code)."""
    if form == "squared":
        return z.pow(2).sum(dim=1).mean()
    if form == "norm":
        return z.norm(dim=1).mean()
    raise ValueError(f"unknown L2R form {form!r}; choose one of: {', '.join(L2R_FORMS)}")


def gaussian_kl(
    mu: torch.Tensor, sigma: torch.Tensor, ref_mu: torch.Tensor, ref_sigma: torch.Tensor
) -> torch.Tensor:
    """KL(N(μ, σ²) ‖ N(r_μ, r_σ²)) of diagonal Gaussians, summed over the last dimension:
    Σ_d log(r_σ/σ) + (σ² + (μ − r_μ)²) / (2 r_σ²) − 1/2."""
    terms = (
        torch.log(ref_sigma)
        - torch.log(sigma)
        + (sigma.pow(2) + (mu - ref_mu).pow(2)) / (2 * ref_sigma.pow(2))
        - 0.5
    )
    return terms.sum(dim=-1)


def cmi_penalty(
    mu: torch.Tensor,
    sigma: torch.Tensor,
    labels: torch.Tensor,
    ref_mu: torch.Tensor,
    ref_sigma_raw: torch.Tensor,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """CMI bound E KL(p(z|x) ‖ r(z|y)), r(z|y) = N(r_μ[y], softplus(r_σ_raw[y])²); batch mean.

    ``scale`` is the official code's learnable C multiplying μ and σ (None: no scaling).
    """
    if scale is not None:
        mu, sigma = mu * scale, sigma * scale
    ref_sigma = F.softplus(ref_sigma_raw)
    return gaussian_kl(mu, sigma, ref_mu[labels], ref_sigma[labels]).mean()


class FedSR(Algorithm):
    """FedSR: the featurizer outputs (μ, σ), z ~ N(μ, σ²) by reparameterization, and the local
    loss is CE(g(z), y) + α_L2R·E‖z‖² + α_CMI·E KL(N(μ, σ²) ‖ N(r_μ[y], r_σ[y]²)). L2R aligns
    every client's marginal p(z) to a Gaussian around 0; the CMI bound aligns p(z|y) to the
    learnable per-class reference r(z|y). The server takes FedAvg's sample-weighted mean of
    backbone, posterior layer and classifier. Test time averages the softmax over S samples
    of z (or classifies μ with ``predict_with_mean``).

    The reference parameters r_μ (zeros), r_σ (raw, ones; r_σ = softplus(raw)) and, with
    ``cmi_scale``, C (one) are client state (``ctx.state``), trained with the same optimizer;
    as in the official code they never leave the client unless ``share_reference`` is set,
    which declares them as ``reference`` prototypes and averages them like the model.

    Deviation notes:
    - L2R is E‖z‖² as in the paper; the official code uses E‖z‖ (``l2r="norm"``).
    - r_σ = softplus(raw) with raw initialized to one, and the learnable scale C
      (``cmi_scale``), are the official code's choices; the paper leaves them open.
    - The posterior layer is a linear map from the backbone's features to 2·z_dim (the
      official code replaces ResNet's ``fc`` by it; on fedshift's CNNs it follows the
      feature layer).
    - The optimizer is rebuilt every round (the official one keeps momentum across rounds).
    - Local work per round: the official ``src/main.py`` runs ``total_iters / E`` rounds
      (5000 / 5 = 1000) of ``train_client(loader, steps=E)``, and each of the E = 5 steps
      trains on ``next(iter(loader))`` — the first batch of a freshly shuffled loader, so
      every step sees an independently drawn batch of 64 and a round is 5 SGD steps
      whatever the client's size. fedshift runs the run's ``local_epochs`` full shuffled
      passes over the client's split (one by default), so a round's work grows with the
      split; there is no step-count option.
    - Server mean: the official ``Base.communicate`` (``src/methods/base.py``) replaces
      every parameter and buffer by the plain mean over the source clients (sum / count;
      the target's process is left out). fedshift takes FedAvg's ``num-examples``-weighted
      mean (``average_replies``), of the model and, with ``share_reference``, of the
      reference; the two agree only when the clients' splits are equally large.
    - Test-time noise comes from a generator seeded by the run seed, so evaluation is
      deterministic; training noise comes from the client's ``ctx.rng``.
    """

    name = "fedsr"
    paper = (
        "Nguyen, Torr and Lim, FedSR: A Simple and Effective Domain Generalization Method "
        "for Federated Learning, NeurIPS 2022"
    )
    Hparams = FedSRHparams
    shares = {"model": Kind.MODEL}

    def __init__(self, hp: FedSRHparams, run):
        super().__init__(hp, run)
        if hp.share_reference:
            self.shares = {**type(self).shares, "reference": Kind.PROTOTYPE}

    def build_net(self) -> FedSRNet:
        """The backbone plus posterior layer and head, their init depending only on the seed."""
        base = self.run.build_model()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.run.seed, "fedsr-posterior"))
            return FedSRNet(base, self.hp.z_dim or base.embed_dim)

    def predict(self, model: FedSRNet, x: torch.Tensor) -> torch.Tensor:
        """log of the softmax averaged over S samples of z (or the logits of μ)."""
        mu, sigma = model.distribution(x)
        if self.hp.predict_with_mean:
            return model.classifier(mu)
        samples = self.hp.predict_samples
        gen = torch_generator(self.run.seed, "fedsr-predict")
        noise = torch.randn((samples, *mu.shape), generator=gen).to(mu.device)
        z = (mu + sigma * noise).reshape(samples * len(mu), -1)
        probs = F.softmax(model.classifier(z), dim=1).reshape(samples, len(mu), -1).mean(0)
        return torch.log(probs)

    def round(self, state: ServerState, fed: Federation):
        """1. The sampled clients train from the global model (and, with
        ``share_reference``, the averaged reference r_μ, r_σ); 2. the server keeps the
        sample-weighted mean of their models; 3. with ``share_reference``, that of their
        references too."""
        # 1. local training
        sent = Record().with_arrays("model", state.model)
        if self.hp.share_reference and "reference" in state.extra:
            sent.with_arrays("reference", state.extra["reference"])
        # 2. FedAvg of the models; 3. with share_reference, of the references
        shared = ("model", "reference") if self.hp.share_reference else ("model",)
        replies, means = call_and_average(fed, sent, self.run.aggregator, shared)
        if replies:
            state.model = means["model"]
            if self.hp.share_reference:
                state.extra["reference"] = means["reference"]
        return state, {
            "train_loss": weighted_metric(replies, "loss"),
            "l2r": weighted_metric(replies, "l2r"),
            "cmi": weighted_metric(replies, "cmi"),
        }

    def _reference(self, ctx: ClientContext, record: Record, z_dim: int) -> dict[str, Any]:
        """This client's r_μ, raw r_σ (and C) as trainable leaves on the device."""
        ref = {
            "mu": ctx.state.get("r_mu", torch.zeros(ctx.num_classes, z_dim)),
            "sigma": ctx.state.get("r_sigma", torch.ones(ctx.num_classes, z_dim)),
        }
        if self.hp.share_reference:
            ref.update(record.subset("reference"))
        if self.hp.cmi_scale:
            ref["scale"] = ctx.state.get("cmi_scale", torch.ones(()))
        return {k: v.detach().clone().to(ctx.device).requires_grad_(True) for k, v in ref.items()}

    def reply_schema(self, task: str, sent: Record) -> ReplySchema:
        """The model back and, with ``share_reference``, the reference r_μ, r_σ (one row of
        ``z_dim`` per class; before any was averaged the server sends none)."""
        schema = echo(sent, "model")
        if "reference" in self.shares:
            spec = ArraySpec((self.run.num_classes, None), torch.float32)
            schema.update({"reference.mu": spec, "reference.sigma": spec})
        return schema

    @client_task("train")
    def train(self, ctx: ClientContext, record: Record) -> Record:
        cfg, hp = ctx.train_cfg, self.hp
        model = self.build_net()
        model.load_state_dict(record.subset("model"))
        model.to(ctx.device).train()
        ref = self._reference(ctx, record, model.z_dim)

        def step_loss(x: torch.Tensor, y: torch.Tensor):
            mu, sigma = model.distribution(x)
            noise = torch.randn(mu.shape, generator=ctx.rng).to(ctx.device)
            z = mu + sigma * noise
            l2r = l2r_penalty(z, hp.l2r)
            cmi = cmi_penalty(mu, sigma, y, ref["mu"], ref["sigma"], ref.get("scale"))
            loss = F.cross_entropy(model.classifier(z), y) + hp.alpha_l2r * l2r
            loss = loss + hp.alpha_cmi * cmi
            return loss, {"l2r": l2r, "cmi": cmi}

        sums, seen = fit(
            make_optimizer([*model.parameters(), *ref.values()], cfg),
            cfg.local_epochs,
            lambda: ctx.train.batches(cfg.batch_size, ctx.rng),
            step_loss,
            terms=("l2r", "cmi"),
            precision=ctx.precision,
        )
        ctx.state["r_mu"] = ref["mu"].detach().cpu().clone()
        ctx.state["r_sigma"] = ref["sigma"].detach().cpu().clone()
        if hp.cmi_scale:
            ctx.state["cmi_scale"] = ref["scale"].detach().cpu().clone()
        reply = Record().with_arrays("model", state_dict_cpu(model))
        if hp.share_reference:
            reply.with_arrays("reference", {"mu": ctx.state["r_mu"], "sigma": ctx.state["r_sigma"]})
        reply.metrics.update(local_metrics(ctx, seen, **sums))
        return reply
