"""The algorithm toolkit, public for plug-in authors: model (de)serialization, the local-step
loop (:func:`fit`), the supervised and segmentation local objectives and FedAvg's round
(:func:`averaging_round`). A reply's metrics (``local_metrics``) and the vectorized plan
(``SupervisedPlan``) are part of the contract, in :mod:`fedshift.core.algorithm`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from fedshift.core.algorithm import local_metrics
from fedshift.core.context import ClientContext, MixedPrecision, TrainConfig
from fedshift.core.federation import Federation
from fedshift.core.privacy import PrivacySettings, PrivateMean
from fedshift.core.record import Record
from fedshift.core.reduce import RunningMean
from fedshift.core.robust import Aggregator
from fedshift.core.seeding import torch_generator
from fedshift.core.state import ServerState
from fedshift.eval.segmentation import mask_batches, segmentation_loss

Penalty = Callable[[torch.nn.Module], torch.Tensor]
#: one batch's loss: ``(x, y) -> loss`` or ``(x, y) -> (loss, {name: term})``; the named
#: terms are reported (batch-size-weighted means) beside ``loss``
StepLoss = Callable[[torch.Tensor, Any], torch.Tensor | tuple[torch.Tensor, dict[str, Any]]]


def state_dict_cpu(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of the model's parameters and buffers."""
    return {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}


def model_record(model: torch.nn.Module, prefix: str = "model") -> Record:
    return Record().with_arrays(prefix, state_dict_cpu(model))


def model_from_record(ctx: ClientContext, record: Record, prefix: str = "model") -> torch.nn.Module:
    """Build the client's model and load the weights sent under ``prefix``.

    The module is leased from the client's model builder where it offers leases (a module
    reused across client calls, see :class:`~fedshift.engine.assembly.ModelBuilder`): every
    weight is overwritten here and the caller keeps only copies of its tensors.
    """
    lease = getattr(ctx.build_model, "lease", None)
    model = lease() if lease is not None else ctx.build_model()
    model.load_state_dict(record.subset(prefix))
    return model.to(ctx.device)


def make_optimizer(params, cfg: TrainConfig, lr: float | None = None) -> torch.optim.Optimizer:
    lr = cfg.lr if lr is None else lr
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}; choose one of: sgd, adam")


def fit(
    optimizer: torch.optim.Optimizer,
    epochs: int,
    batches: Callable[[], Iterable[tuple[torch.Tensor, Any]]],
    step_loss: StepLoss,
    *,
    terms: Iterable[str] = (),
    min_batch: int = 2,
    precision: MixedPrecision | None = None,
) -> tuple[dict[str, float], int]:
    """The local-step loop every algorithm shares: for each of ``epochs`` passes over
    ``batches()``, one optimizer step on ``step_loss(x, y)`` per batch.

    Batches smaller than ``min_batch`` are skipped (BatchNorm cannot train on a single
    sample). ``step_loss`` runs under the run's ``precision`` (``ctx.precision``: autocast,
    with a loss scaler for fp16; none given: fp32). Returns the batch-size-weighted sums of
    ``loss`` and of each named term (those listed in ``terms`` are 0 when no batch was
    trained), and the number of samples seen (:func:`local_metrics` turns them into a
    reply's metrics).
    """
    precision = precision or MixedPrecision()
    scaler = precision.scaler()
    sums: dict[str, float] = {"loss": 0.0, **dict.fromkeys(terms, 0.0)}
    seen = 0
    for _ in range(epochs):
        for x, y in batches():
            if len(x) < min_batch:
                continue
            with precision.autocast():
                out = step_loss(x, y)
            loss, terms = out if isinstance(out, tuple) else (out, {})
            optimizer_step(optimizer, loss, scaler)
            for key, value in {"loss": loss, **terms}.items():
                sums[key] = sums.get(key, 0.0) + float(value.detach()) * len(x)
            seen += len(x)
    return sums, seen


def train_supervised(
    model: torch.nn.Module,
    ctx: ClientContext,
    *,
    penalty: Penalty | None = None,
    epochs: int | None = None,
) -> dict[str, float]:
    """Cross-entropy SGD on the client's labeled training split for ``epochs`` epochs.

    ``penalty(model)`` is added to each batch loss (FedProx's proximal term, Ditto's).
    Batches of a single sample are skipped: BatchNorm cannot train on them.
    Returns the mean loss, the split size (``num-examples``) and samples processed.
    """
    cfg = ctx.train_cfg
    model.to(ctx.device).train()

    def step_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return with_penalty(F.cross_entropy(model(x), y), model, penalty)

    sums, seen = fit(
        make_optimizer(model.parameters(), cfg),
        cfg.local_epochs if epochs is None else epochs,
        lambda: ctx.train.batches(cfg.batch_size, ctx.rng),
        step_loss,
        precision=ctx.precision,
    )
    return local_metrics(ctx, seen, **sums)


def train_segmentation(
    model: torch.nn.Module,
    ctx: ClientContext,
    *,
    penalty: Penalty | None = None,
    epochs: int | None = None,
) -> dict[str, float]:
    """Soft-Dice SGD on the client's masks (the segmentation twin of :func:`train_supervised`;
    as in the official ELCFS code, a batch of one sample is trained on too)."""
    cfg = ctx.train_cfg
    model.to(ctx.device).train()

    def step_loss(x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return with_penalty(segmentation_loss(model(x), target), model, penalty)

    sums, seen = fit(
        make_optimizer(model.parameters(), cfg),
        cfg.local_epochs if epochs is None else epochs,
        lambda: mask_batches(ctx.train, cfg.batch_size, ctx.rng),
        step_loss,
        min_batch=1,
        precision=ctx.precision,
    )
    return local_metrics(ctx, seen, **sums)


def optimizer_step(
    optimizers: torch.optim.Optimizer | Sequence[torch.optim.Optimizer],
    loss: torch.Tensor,
    scaler: torch.amp.GradScaler | None = None,
) -> float:
    """Clear the gradients of ``optimizers``, backpropagate ``loss`` and step each of them;
    returns the loss's value. For loops that ``fit`` does not cover: several models and
    losses per batch (adversarial ones), or a step with a schedule (PerAda's KD); compute
    their losses under ``ctx.autocast()`` and pass ``ctx.precision.scaler()`` (made once per
    local training call) as ``scaler``: fp16 losses are then scaled and steps with
    non-finite gradients skipped."""
    group = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
    for optimizer in group:
        optimizer.zero_grad(set_to_none=True)
    if scaler is None:
        loss.backward()
        for optimizer in group:
            optimizer.step()
    else:
        scaler.scale(loss).backward()
        for optimizer in group:
            scaler.step(optimizer)
        scaler.update()
    return float(loss.detach())


def with_penalty(loss: torch.Tensor, model: torch.nn.Module, penalty: Penalty | None):
    """``loss + penalty(model)`` (FedProx's and Ditto's proximal term), or ``loss``."""
    return loss if penalty is None else loss + penalty(model)


def proximal_penalty(anchor: dict[str, torch.Tensor], mu: float) -> Penalty:
    """μ/2·‖w − anchor‖² over the model's trainable parameters (FedProx, Ditto)."""

    def penalty(model: torch.nn.Module) -> torch.Tensor:
        terms = [
            (param - anchor[name]).pow(2).sum()
            for name, param in model.named_parameters()
            if param.requires_grad
        ]
        return 0.5 * mu * torch.stack(terms).sum()

    return penalty


def trainable_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Zeros shaped like each trainable parameter (where a control variate, a gradient
    history or a direction lives; BatchNorm buffers have none)."""
    return {
        name: torch.zeros_like(param.detach(), device="cpu")
        for name, param in model.named_parameters()
        if param.requires_grad
    }


def linear_penalty(direction: dict[str, torch.Tensor]) -> Penalty:
    """⟨w, d⟩ summed over the trainable parameters named in ``direction``: its gradient
    adds ``d`` to each parameter's gradient (SCAFFOLD's correction c − c_i, FedDyn's
    linear term)."""

    def penalty(model: torch.nn.Module) -> torch.Tensor:
        terms = [
            (param * direction[name]).sum()
            for name, param in model.named_parameters()
            if name in direction
        ]
        return torch.stack(terms).sum()

    return penalty


def counting(penalty: Penalty) -> tuple[Penalty, list[int]]:
    """``penalty`` wrapped to count its calls (one per trained batch, so the local steps
    taken: SCAFFOLD's K, FedNova's τ), and the one-item list holding the count."""
    count = [0]

    def counted(model: torch.nn.Module) -> torch.Tensor:
        count[0] += 1
        return penalty(model)

    return counted, count


def average_replies(
    replies: dict[int, Record], aggregator: Aggregator, prefix: str = "model"
) -> dict[str, torch.Tensor]:
    """FedAvg's rule: the ``num-examples``-weighted mean of the tensors sent under ``prefix``
    (with ``aggregator=mean``; a robust ``aggregator`` combines them its own way)."""
    return aggregator(
        [r.subset(prefix) for r in replies.values()],
        [r.metrics["num-examples"] for r in replies.values()],
    )


class MeanFold:
    """FedAvg's rule folded in as replies arrive (``fed.call(..., fold=MeanFold())``): the
    ``num-examples``-weighted running mean of the tensors sent under ``prefix`` (with
    ``uniform``, the plain mean), taken out of each reply once added, so a round holds one
    running sum instead of every client's model. Bit for bit :func:`average_replies` with
    ``aggregator=mean``."""

    def __init__(self, prefix: str = "model", uniform: bool = False):
        self.prefix = prefix
        self.uniform = uniform
        self.running = RunningMean()

    def __call__(self, cid: int, reply: Record) -> None:
        weight = 1.0 if self.uniform else reply.metrics["num-examples"]
        self.running.add(reply.take(self.prefix), weight)

    def result(self) -> dict[str, torch.Tensor]:
        return self.running.result()


def call_and_average(
    fed: Federation,
    sent: Record,
    aggregator: Aggregator,
    prefixes: Sequence[str] = ("model",),
    *,
    uniform: bool = False,
    task: str = "train",
) -> tuple[dict[int, Record], dict[str, dict[str, torch.Tensor]]]:
    """``task`` on the sampled clients, and for each of ``prefixes`` the mean of the
    tensors the replies sent under it (``num-examples``-weighted; ``uniform``: plain).

    With ``aggregator=mean`` each reply is folded in as it arrives (:class:`MeanFold`) and
    the replies come back without those tensors; a robust ``aggregator`` combines the held
    replies its own way. No means when nobody replied.
    """
    if aggregator.is_mean:
        folds = [MeanFold(prefix, uniform) for prefix in prefixes]

        def fold(cid: int, reply: Record) -> None:
            for each in folds:
                each(cid, reply)

        replies = fed.call(task, fed.sample(), sent, fold=fold)
        means = {each.prefix: each.result() for each in folds} if replies else {}
        return replies, means
    replies = fed.call(task, fed.sample(), sent)
    if not replies:
        return replies, {}
    weights = [1.0 if uniform else r.metrics["num-examples"] for r in replies.values()]
    return replies, {
        prefix: aggregator([r.subset(prefix) for r in replies.values()], weights)
        for prefix in prefixes
    }


def averaging_round(
    state: ServerState,
    fed: Federation,
    aggregator: Aggregator,
    metrics: Mapping[str, str] = {"train_loss": "loss"},  # noqa: B006 - read only
    privacy: PrivacySettings | None = None,
    seed: int = 0,
) -> tuple[ServerState, dict[str, float]]:
    """FedAvg's round: the sampled clients train from the global model under ``model``
    and the server keeps the ``num-examples``-weighted mean of their models, folded in as
    the replies arrive, or what the run's robust ``aggregator`` makes of them (unchanged
    when nobody replied) (:func:`call_and_average`). ``metrics`` maps round metrics to the
    reply metric they average. With ``privacy`` (the run's DP settings) the new model is
    DP-FedAvg's instead: the clipped updates summed as they arrive, divided by the number of
    clients sampled (a failed client is a zero update), plus Gaussian noise
    (:class:`~fedshift.core.privacy.PrivateMean`).
    """
    sent = Record().with_arrays("model", state.model)
    if privacy is None:
        replies, means = call_and_average(fed, sent, aggregator)
        state.model = means.get("model", state.model)
    else:
        sampled = fed.sample()
        private = PrivateMean(state.model, privacy.clip, denominator=len(sampled))
        replies = fed.call(
            "train", sampled, sent, fold=lambda cid, reply: private.add(reply.take("model"))
        )
        if replies:
            generator = torch_generator(seed, "dp-noise", fed.round)
            state.model = private.result(privacy.noise_multiplier, generator)
    return state, {name: weighted_metric(replies, key) for name, key in metrics.items()}


def weighted_metric(replies: dict[int, Record], key: str) -> float:
    """Mean of a reply metric weighted by ``num-examples`` (NaN when nobody replied)."""
    pairs = [
        (float(r.metrics[key]), float(r.metrics.get("num-examples", 1)))
        for r in replies.values()
        if key in r.metrics
    ]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else float("nan")


def reply_with_model(weights: dict[str, torch.Tensor], metrics: dict[str, float]) -> Record:
    """The reply of FedAvg's ``train`` task: the trained model under ``model``, and metrics."""
    reply = Record().with_arrays("model", weights)
    reply.metrics.update(metrics)
    return reply
