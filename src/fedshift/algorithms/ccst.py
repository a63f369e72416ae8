"""CCST: cross-client style transfer (Chen et al., WACV 2023)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.toolkit import (
    call_and_average,
    fit,
    make_optimizer,
    model_from_record,
    model_record,
    weighted_metric,
    with_penalty,
)
from fedshift.core.algorithm import RunInfo, client_task, local_metrics
from fedshift.core.context import ClientContext
from fedshift.core.errors import ConfigError, RoundFailed
from fedshift.core.federation import Federation
from fedshift.core.hparams import BaseHparams, hp
from fedshift.core.record import Kind, Record
from fedshift.core.schema import ArraySpec, ReplySchema
from fedshift.core.split import to_input
from fedshift.core.state import ServerState
from fedshift.models.adain import adain, load_adain_networks, pooled_style

StyleType = Literal["overall", "single"]
Aggregation = Literal["weighted", "uniform"]
#: images encoded at once when computing styles
STYLE_BATCH = 64


@dataclass(frozen=True)
class CCSTHparams(BaseHparams):
    style: StyleType = hp(
        "overall",
        "",
        "style a client shares: overall = one mean/std per client (S_k^overall), single = "
        "per-image styles (S_k^single)",
    )
    single_styles: int = hp(32, "J", "per-image styles a client uploads in single mode", low=1)
    styles_per_image: int = hp(
        3, "L", "augmentation level: styles transferred onto each image (clipped to K)", low=1
    )
    alpha: float = hp(
        1.0, "α", "AdaIN content/style trade-off: 1 the full style (official 1.0)", low=0, high=1
    )
    vgg_weights: str = hp(
        "",
        "",
        "local vgg_normalised.pth; with decoder_weights, style transfer by the VGG AdaIN model",
    )
    decoder_weights: str = hp("", "", "local AdaIN decoder.pth, the VGG AdaIN model's decoder")
    aggregation: Aggregation = hp(
        "weighted",
        "",
        "server mean of the models: weighted by train-split size (FedAvg), or uniform 1/K over "
        "the round's clients (the official fed_run.py)",
    )

    def check(self) -> None:
        if bool(self.vgg_weights) != bool(self.decoder_weights):
            raise ConfigError(
                "the VGG AdaIN model needs both algo.vgg_weights and algo.decoder_weights "
                "(local files); give both, or neither for image-space AdaIN"
            )


def unit_range(x: torch.Tensor) -> torch.Tensor:
    """Model inputs in [-1, 1] -> images in [0, 1]."""
    return (x + 1.0) * 0.5


class CCST(FedAvg):
    """Cross-client style transfer, then FedAvg on the style-augmented local data.

    Before round 1 (``setup``) every source client computes its style — the channel-wise mean
    and std of encoder features — either one *overall* domain style over all of its training
    images (population variance over every pixel, the default: it shares least) or *single*
    styles of J random images; the server stacks them into the style bank B and broadcasts it
    once. Each client stores B in ``ctx.state`` with a fixed draw, per image, of L distinct
    bank entries (and, in single mode, one of the J styles of each), so its augmented set
    has N_k × L images for the whole run, as in the paper's offline augmentation. Training is
    FedAvg on that set: every epoch visits each (image, style) pair once, stylizing on the
    fly by AdaIN, x' = D(α·AdaIN(E(x), S) + (1 − α)·E(x)).

    Encoder/decoder: with ``vgg_weights`` and ``decoder_weights`` (local files) the original
    AdaIN model — VGG-19 to relu4_1 and its trained decoder — is used (inputs mapped to RGB in
    [0, 1]; grey images repeated to three channels and averaged back). Without them the
    default is AdaIN *in image space*: E is the identity on pixels in [0, 1] and D its exact
    inverse, so a style is the per-channel pixel mean/std (2·C numbers) and transfer shifts
    colour and contrast. It needs no download, is deterministic, and is exactly invertible —
    a fixed random filter bank would need a learned decoder to be inverted. Stylized images
    are clamped to [0, 1], as writing them to image files does in the official pipeline.

    Why the bank lives in client state: the paper broadcasts it once; keeping it (and the
    style draw) in ``ctx.state`` keeps per-round traffic equal to FedAvg's, and the one-off
    exchange shows in ``bytes_up``/``bytes_down`` (the ``style-stats`` and ``style-bank``
    calls of ``setup``). Checkpoints carry it, so resuming needs no new exchange.

    Deviation notes:

    * When the draw picks the client's own domain the original image is used (the official
      data reorganization copies the original instead of self-stylizing).
    * The official code stylizes once offline and saves images; here stylization happens on
      the fly from the same fixed draw (identical data up to image-file quantization).
    * J is not fixed by the paper; the official single mode draws one style image per batch
      of 32 — ``single_styles`` defaults to 32.
    * A client that missed the bank broadcast (failure policy ``resilient``/``dynamic``)
      trains on its original images only.
    * Server mean: the official ``federated/fed_run.py`` gives every client the weight 1/K
      (its ``client_weights`` list, K source clients, all of which train every round) in
      ``communication``, whatever the sizes of their splits. fedshift defaults to FedAvg's
      train-split-size weights (``aggregation="weighted"``), as the method description
      trains with FedAvg; ``aggregation="uniform"`` takes the plain mean over the round's
      clients, as the official code. The two differ when the splits are unequal
      (PACS domains hold 1,670 to 3,929 images: weighting gives sketch more than twice
      photo's say); the round metric ``train_loss`` stays size-weighted either way.
    * Optimizer: the official main loop builds, at the start of every round, a new
      ``optim.SGD(params, lr=args.lr)`` per client — no momentum and no weight decay (its
      defaults: lr 1e-2, batch 32, one local epoch ``wk_iters=1``, 500 rounds ``iters``).
      fedshift also starts each round's local training from a fresh optimizer (nothing
      carried across rounds) but uses the run's SGD settings, momentum 0.9 and weight
      decay 5e-4 by default; ``--set momentum=0 --set weight_decay=0`` gives the official
      momentum-free, decay-free SGD.
    """

    name = "ccst"
    paper = (
        "Chen et al., Federated Domain Generalization for Image Recognition via Cross-Client "
        "Style Transfer, WACV 2023"
    )
    Hparams = CCSTHparams
    shares = {"model": Kind.MODEL, "style": Kind.STYLE}
    private = False  # its other shares are not covered by DP

    def __init__(self, hp: CCSTHparams, run: RunInfo):
        super().__init__(hp, run)
        self._networks: dict[str, tuple[torch.nn.Module, torch.nn.Module]] = {}
        if hp.vgg_weights:
            self._networks["cpu"] = load_adain_networks(hp.vgg_weights, hp.decoder_weights)

    # -- server --------------------------------------------------------------------------
    def round(self, state: ServerState, fed: Federation):
        """FedAvg's round with CCST's choice of mean:

        1. the sampled clients train from the global model on their style-augmented data;
        2. the server keeps the split-size-weighted mean of their models
           (``aggregation="weighted"``) or the plain mean (``"uniform"``, official code).
        """
        # 1. local training
        # 2. server mean, folded in as the replies arrive
        replies, means = call_and_average(
            fed,
            Record().with_arrays("model", state.model),
            self.run.aggregator,
            uniform=self.hp.aggregation == "uniform",
        )
        state.model = means.get("model", state.model)
        return state, {"train_loss": weighted_metric(replies, "loss")}

    def setup(self, state: ServerState, fed: Federation) -> ServerState:
        """Build the style bank once, before round 1:

        1. every source client computes and sends its style;
        2. the server stacks the styles into the bank B and broadcasts it.
        """
        ids = fed.clients()
        # 1. local styles
        replies = fed.call("style-stats", ids, Record())
        if not replies:
            raise RoundFailed("CCST: no client returned its style; the style bank is empty")
        # 2. the style bank, broadcast once
        owners = sorted(replies)
        bank = Record(
            arrays={
                "bank.mean": torch.stack([replies[c].arrays["style.mean"] for c in owners]),
                "bank.std": torch.stack([replies[c].arrays["style.std"] for c in owners]),
                "bank.client": torch.tensor(owners, dtype=torch.int64),
            }
        )
        fed.call("style-bank", ids, bank)
        return state

    # -- encoder / decoder -----------------------------------------------------------------
    def _vgg(self, device: torch.device) -> tuple[torch.nn.Module, torch.nn.Module] | None:
        if not self._networks:
            return None
        key = str(device)
        if key not in self._networks:
            encoder, decoder = self._networks["cpu"]
            self._networks[key] = (
                copy.deepcopy(encoder).to(device),
                copy.deepcopy(decoder).to(device),
            )
        return self._networks[key]

    def encode(self, images: torch.Tensor) -> torch.Tensor:
        """Images in [0, 1] -> the features whose channel statistics are the style."""
        vgg = self._vgg(images.device)
        if vgg is None:
            return images
        if images.shape[1] == 1:
            images = images.expand(-1, 3, -1, -1)
        return vgg[0](images)

    def decode(self, feat: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Features -> images in [0, 1] shaped like ``like``."""
        vgg = self._vgg(feat.device)
        if vgg is None:
            return feat.clamp(0.0, 1.0)
        out = vgg[1](feat)
        if out.shape[-2:] != like.shape[-2:]:
            out = F.interpolate(out, size=like.shape[-2:], mode="bilinear", align_corners=False)
        if like.shape[1] == 1:
            out = out.mean(dim=1, keepdim=True)
        return out.clamp(0.0, 1.0)

    @torch.no_grad()
    def stylize(
        self, x: torch.Tensor, style_mean: torch.Tensor, style_std: torch.Tensor
    ) -> torch.Tensor:
        """Model inputs ``x`` in [-1, 1] restyled by AdaIN to per-sample styles ``(N, C)``."""
        images = unit_range(x)
        feat = adain(self.encode(images), style_mean, style_std, self.hp.alpha)
        return self.decode(feat, images) * 2.0 - 1.0

    # -- client tasks ----------------------------------------------------------------------
    def reply_schema(self, task: str, sent: Record) -> ReplySchema:
        """``style-stats``: the style's mean and std, ``(1, C)`` overall or ``(J, C)``."""
        if task == "style-stats":
            rows = 1 if self.hp.style == "overall" else self.hp.single_styles
            spec = ArraySpec((rows, None), torch.float32)
            return {"style.mean": spec, "style.std": spec}
        return super().reply_schema(task, sent)

    @client_task("style-stats")
    @torch.no_grad()
    def style_stats(self, ctx: ClientContext, record: Record) -> Record:
        """This client's style: ``(1, C)`` overall or ``(J, C)`` single-image mean and std."""
        images = ctx.train.x
        n = len(images)
        if self.hp.style == "overall":
            total = sq_total = None
            count = 0
            for start in range(0, n, STYLE_BATCH):
                feat = self.encode(
                    unit_range(to_input(images[start : start + STYLE_BATCH], ctx.device))
                )
                feat = feat.double()
                part = feat.sum(dim=(0, 2, 3))
                sq_part = feat.pow(2).sum(dim=(0, 2, 3))
                total = part if total is None else total + part
                sq_total = sq_part if sq_total is None else sq_total + sq_part
                count += feat.shape[0] * feat.shape[2] * feat.shape[3]
            mean, std = pooled_style(total, sq_total, count)
            mean, std = mean[None], std[None]
        else:
            j = self.hp.single_styles
            if n >= j:
                picked = torch.randperm(n, generator=ctx.rng)[:j]
            else:
                picked = torch.randint(n, (j,), generator=ctx.rng)
            feat = self.encode(unit_range(to_input(images[picked], ctx.device))).double()
            pixels = feat.shape[2] * feat.shape[3]
            mean, std = pooled_style(feat.sum(dim=(2, 3)), feat.pow(2).sum(dim=(2, 3)), pixels)
        return Record(
            arrays={"style.mean": mean.float().cpu(), "style.std": std.float().cpu()},
            metrics={"num-examples": n},
        )

    @client_task("style-bank")
    def receive_bank(self, ctx: ClientContext, record: Record) -> Record:
        """Keep the broadcast bank and draw, per image, L distinct bank entries once."""
        mean, std = record.arrays["bank.mean"], record.arrays["bank.std"]
        owners = record.arrays["bank.client"]
        n, k, j = len(ctx.train), mean.shape[0], mean.shape[1]
        per_image = min(self.hp.styles_per_image, k)
        domains = torch.rand(n, k, generator=ctx.rng).argsort(dim=1)[:, :per_image]
        picks = torch.randint(j, (n, per_image), generator=ctx.rng)
        ctx.state["style_bank"] = {
            "mean": mean,
            "std": std,
            "client": owners,
            "domain": domains,
            "pick": picks,
        }
        return Record(metrics={"num-examples": n})

    @client_task("train")
    def train(self, ctx: ClientContext, record: Record) -> Record:
        model = model_from_record(ctx, record)
        metrics = self.train_augmented(model, ctx, self.local_penalty(ctx, record))
        reply = model_record(model)
        reply.metrics.update(metrics)
        return reply

    def train_augmented(
        self, model: torch.nn.Module, ctx: ClientContext, penalty
    ) -> dict[str, Any]:
        """E epochs of cross-entropy SGD over the N_k × L (image, style) pairs."""
        cfg = ctx.train_cfg
        bank = ctx.state.get("style_bank")
        n = len(ctx.train)
        if bank is None:
            domains = torch.full((n, 1), -1, dtype=torch.int64)
            picks = torch.zeros((n, 1), dtype=torch.int64)
            own = -1
        else:
            domains, picks = bank["domain"], bank["pick"]
            mine = (bank["client"] == ctx.client_id).nonzero()
            own = int(mine[0, 0]) if len(mine) else -1
        per_image = domains.shape[1]
        model.to(ctx.device).train()

        def styled_batches():
            """Shuffled (image, style slot) pairs; each slot's image restyled as drawn."""
            order = torch.randperm(n * per_image, generator=ctx.rng)
            for start in range(0, len(order), cfg.batch_size):
                idx = order[start : start + cfg.batch_size]
                if len(idx) < 2:
                    continue
                image, slot = idx // per_image, idx % per_image
                x = to_input(ctx.train.x[image], ctx.device)
                y = ctx.train.y[image].to(ctx.device)
                domain = domains[image, slot]
                restyle = (domain >= 0) & (domain != own)
                if bool(restyle.any()):
                    chosen, pick = domain[restyle], picks[image, slot][restyle]
                    x[restyle.to(ctx.device)] = self.stylize(
                        x[restyle.to(ctx.device)],
                        bank["mean"][chosen, pick].to(ctx.device),
                        bank["std"][chosen, pick].to(ctx.device),
                    )
                yield x, y

        def step_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return with_penalty(F.cross_entropy(model(x), y), model, penalty)

        optimizer = make_optimizer(model.parameters(), cfg)
        sums, seen = fit(
            optimizer, cfg.local_epochs, styled_batches, step_loss, precision=ctx.precision
        )
        return local_metrics(ctx, seen, **sums)
