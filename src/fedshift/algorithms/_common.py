"""Small helpers shared by algorithms: model (de)serialization and a local SGD loop."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from fedshift.core.context import ClientContext, TrainConfig
from fedshift.core.record import Record
from fedshift.core.reduce import weighted_mean

Penalty = Callable[[torch.nn.Module], torch.Tensor]


def state_dict_cpu(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of the model's parameters and buffers."""
    return {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}


def model_record(model: torch.nn.Module, prefix: str = "model") -> Record:
    return Record().with_arrays(prefix, state_dict_cpu(model))


def model_from_record(ctx: ClientContext, record: Record, prefix: str = "model") -> torch.nn.Module:
    """Build the client's model and load the weights sent under ``prefix``."""
    model = ctx.build_model()
    model.load_state_dict(record.subset(prefix))
    return model.to(ctx.device)


def local_metrics(ctx: ClientContext, seen: int, **sums: float) -> dict[str, float]:
    """A client reply's metrics: each of ``sums`` (a per-sample-weighted sum) as its mean over
    the ``seen`` samples, the split size ``num-examples`` (the aggregation weight) and
    ``samples`` (what was processed, for throughput)."""
    means = {key: value / max(seen, 1) for key, value in sums.items()}
    return {**means, "num-examples": len(ctx.train), "samples": seen}


def make_optimizer(params, cfg: TrainConfig, lr: float | None = None) -> torch.optim.Optimizer:
    lr = cfg.lr if lr is None else lr
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=cfg.weight_decay)
    raise ValueError(f"unknown optimizer {cfg.optimizer!r}; choose one of: sgd, adam")


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
    epochs = cfg.local_epochs if epochs is None else epochs
    model.to(ctx.device).train()
    optimizer = make_optimizer(model.parameters(), cfg)
    total, seen = 0.0, 0
    for _ in range(epochs):
        for x, y in ctx.train.batches(cfg.batch_size, ctx.rng):
            if len(x) < 2:
                continue
            loss = F.cross_entropy(model(x), y)
            total += penalized_step(optimizer, model, loss, penalty) * len(x)
            seen += len(x)
    return local_metrics(ctx, seen, loss=total)


def penalized_step(
    optimizer: torch.optim.Optimizer,
    model: torch.nn.Module,
    loss: torch.Tensor,
    penalty: Penalty | None = None,
) -> float:
    """Add ``penalty(model)`` to ``loss``, take one optimizer step; the total loss's value."""
    if penalty is not None:
        loss = loss + penalty(model)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return float(loss.detach())


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


def average_replies(replies: dict[int, Record], prefix: str = "model") -> dict[str, torch.Tensor]:
    """FedAvg's rule: the ``num-examples``-weighted mean of the tensors sent under ``prefix``."""
    return weighted_mean(
        [r.subset(prefix) for r in replies.values()],
        [r.metrics["num-examples"] for r in replies.values()],
    )


def weighted_metric(replies: dict[int, Record], key: str) -> float:
    """Mean of a reply metric weighted by ``num-examples`` (NaN when nobody replied)."""
    pairs = [
        (float(r.metrics[key]), float(r.metrics.get("num-examples", 1)))
        for r in replies.values()
        if key in r.metrics
    ]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else float("nan")
