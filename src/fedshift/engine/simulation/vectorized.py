"""Vectorized clients: one call of a batchable task runs all its clients together.

The clients' weights are stacked along a new leading dimension and one forward/backward pass
of ``torch.func.vmap`` over ``torch.func.functional_call`` trains them all: per-client
BatchNorm buffers, per-client SGD state (momentum, weight decay, applied functionally on the
stacked tensors with the same elementwise operations as ``torch.optim.SGD``) and per-client
batch orders (each client draws its batches from its own seeded generator exactly as its
sequential run does). Clients whose batches differ in size at a step (the last, short batch;
clients with fewer samples) are bucketed by batch size, so no padding enters BatchNorm's
statistics. The replies equal sequential execution up to floating-point reduction order.

What runs here is described by the algorithm (:meth:`~fedshift.core.algorithm.Algorithm.
batch_plan`); anything it cannot describe, or a model with random layers, runs sequentially.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from fedshift.core.algorithm import Algorithm, SupervisedPlan, local_metrics
from fedshift.core.context import ClientContext
from fedshift.core.record import Record
from fedshift.core.runconfig import VECTORIZE as MODES
from fedshift.core.seeding import derive_seed
from fedshift.core.split import dense, to_input

#: modules that draw random numbers in training: their streams are not per client under vmap
RANDOM_MODULES = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d)


def _honoured(value: object) -> str | None:
    """The vectorized step computes this key's effect exactly as the sequential one does."""
    return None


def _sgd_only(value: object) -> str | None:
    if value == "sgd":
        return None
    return (
        f"optimizer={value}: the vectorized step is SGD's (optimizer=sgd keeps clients vectorized)"
    )


#: Every key of the ``training`` section (:data:`~fedshift.core.context.TrainConfig`) and what
#: the vectorized step does with a run's value of it: None where it computes the same step as
#: the sequential path (:func:`~fedshift.algorithms.toolkit.train_supervised`), else why the
#: run's clients fall back to sequential. A key missing here (a new one) makes every run fall
#: back, and tests/engine/test_vectorized_training_keys.py fails until it is decided here.
TRAINING_KEYS: dict[str, Callable[[object], str | None]] = {
    "local_epochs": _honoured,  # the epochs loop (or the plan's own epochs)
    "batch_size": _honoured,  # the same batches, drawn from the same seeded generator
    "lr": _honoured,  # the SGD update
    "momentum": _honoured,  # SGD's momentum buffer, per client
    "weight_decay": _honoured,  # added to the gradient, as torch.optim.SGD does
    "optimizer": _sgd_only,  # Adam's per-client state is not written here
}


def training_blocker(training: object) -> str | None:
    """Why the ``training`` settings (a ``TrainConfig``) keep clients off the vectorized
    path: the first key of the section :data:`TRAINING_KEYS` refuses or does not know."""
    for item in dataclasses.fields(training):
        decide = TRAINING_KEYS.get(item.name)
        if decide is None:
            return f"training key {item.name} is not known to the vectorized step"
        reason = decide(getattr(training, item.name))
        if reason is not None:
            return reason
    return None


def vectorize_blocker(
    precision: str = "fp32", compile: bool = False, training: object | None = None
) -> str | None:
    """Why a run's settings keep its clients off the vectorized path (None: they do not).

    Reduced precision: autocast does not reach every op under ``torch.func.vmap``. A
    batching rule re-dispatches below the autocast layer to the op it lowers to, and
    autocast lists ``conv2d`` but not the ``aten::convolution`` that vmap's convolution
    rule calls, so a vmapped convolution runs in fp32 while the sequential path runs it in
    bf16/fp16 (linear layers do autocast; fp16 would also need a per-client loss scaler).
    ``compile=true``: the vectorized path trains the uncompiled template functionally.
    ``training`` (the run's ``TrainConfig``, when given): see :func:`training_blocker`."""
    if precision != "fp32":
        return (
            f"precision {precision}: vmap does not autocast convolutions "
            "(precision=fp32 keeps clients vectorized)"
        )
    if compile:
        return "compile=true: the vectorized path is not compiled"
    return training_blocker(training) if training is not None else None


def vectorize_wanted(mode: str, device: torch.device) -> bool:
    """``vectorize`` = on, off or auto (on with CUDA, where it pays; the CPU keeps the
    bit-exact sequential path by default), before any setting blocks it."""
    if mode not in MODES:
        raise ValueError(f"vectorize must be one of {', '.join(MODES)}, got {mode!r}")
    return mode == "on" or (mode == "auto" and device.type == "cuda")


def vectorize_enabled(
    mode: str,
    device: torch.device,
    precision: str = "fp32",
    compile: bool = False,
    training: object | None = None,
) -> bool:
    """:func:`vectorize_wanted`, and only where :func:`vectorize_blocker` finds nothing in the
    run's ``precision`` (the resolved one), ``compile`` and ``training`` section."""
    wanted = vectorize_wanted(mode, device)
    return wanted and vectorize_blocker(precision, compile, training) is None


def vectorize_summary(
    mode: str,
    device: torch.device,
    precision: str = "fp32",
    compile: bool = False,
    training: object | None = None,
) -> str:
    """How a run's clients will execute, in words (``fedshift run --dry-run``)."""
    if vectorize_enabled(mode, device, precision, compile, training):
        return f"vectorized where a task allows (vectorize={mode})"
    blocker = vectorize_blocker(precision, compile, training)
    if vectorize_wanted(mode, device) and blocker:
        return f"sequential (vectorize={mode}, but {blocker})"
    return f"sequential (vectorize={mode} on {device.type})"


@dataclass
class _Stack:
    """The stacked state of a group of clients of one architecture, updated in place."""

    params: dict[str, torch.Tensor]  # trainable parameters, (clients, ...), leaves
    frozen: dict[str, torch.Tensor]  # parameters that do not train
    buffers: dict[str, torch.Tensor]  # BatchNorm running statistics and counters
    momentum: dict[str, torch.Tensor]  # SGD's buffers, zero before a client's first step
    anchor: dict[str, torch.Tensor]  # the start weights of FedProx's term (mu > 0), else {}


@dataclass
class _Step:
    """One SGD step of the clients ``members`` (positions in the call), all on batches of
    ``size``: ``index`` is ``members`` on the device (None: every client takes this step)."""

    members: list[int]
    index: torch.Tensor | None
    size: int
    x: torch.Tensor  # (len(members), size, ...) inputs, on the device
    y: torch.Tensor  # (len(members), size) labels


def run_vectorized(
    algorithm: Algorithm,
    contexts: Mapping[int, ClientContext],
    task: str,
    sends: Mapping[int, Record],
    *,
    seed: int,
    round_: int,
    call_index: int,
    total_rounds: int,
) -> dict[int, Record] | None:
    """Run ``task`` on every client of ``sends`` at once; None when it must run sequentially
    (the algorithm gave no plan for a client, clients differ in architecture, device or
    settings, the model has random layers, or the run trains in reduced precision, which the
    sequential loop autocasts and vmap would not: see :func:`vectorize_blocker`)."""
    if task not in algorithm.batchable or len(sends) < 2:
        return None
    ctxs = [contexts[cid] for cid in sends]
    builders = {id(ctx.build_model) for ctx in ctxs}
    template = getattr(ctxs[0].build_model, "template", None)
    first = ctxs[0]
    if (
        len(builders) != 1
        or template is None
        or any(isinstance(m, RANDOM_MODULES) for m in template.modules())
        or any(ctx.role != "source" for ctx in ctxs)
        or any(ctx.device != first.device or ctx.train_cfg != first.train_cfg for ctx in ctxs)
        or training_blocker(first.train_cfg) is not None
        or first.precision.name != "fp32"
    ):
        return None
    plans: list[SupervisedPlan] = []
    for cid, ctx in zip(sends, ctxs, strict=True):
        ctx.round = round_
        ctx.total_rounds = total_rounds
        ctx.rng = torch.Generator().manual_seed(
            derive_seed(seed, "client", cid, round_, call_index)
        )
        plan = algorithm.batch_plan(task, ctx, sends[cid])
        if not isinstance(plan, SupervisedPlan):
            return None
        plans.append(plan)
    if len({(p.mu, p.epochs) for p in plans}) != 1:
        return None
    results = train_supervised_stacked(template, ctxs, plans)
    return {
        cid: plan.finish(weights, metrics)
        for cid, plan, (weights, metrics) in zip(sends, plans, results, strict=True)
    }


def _batch_orders(ctx: ClientContext, epochs: int) -> list[torch.Tensor]:
    """The index batches :func:`~fedshift.algorithms.toolkit.fit` trains on, in its order:
    :meth:`~fedshift.core.context.SplitView.batches` draws one permutation per epoch from
    the client's generator (and nothing else when there is no augmentation), so drawing
    them up front takes the same numbers; a last batch of one sample is skipped."""
    n, size = len(ctx.train), ctx.train_cfg.batch_size
    orders = []
    for _ in range(epochs):
        order = torch.randperm(n, generator=ctx.rng)
        orders += [order[i : i + size] for i in range(0, n, size) if min(size, n - i) >= 2]
    return orders


def _resident_steps(ctxs: list[ClientContext], epochs: int) -> Iterator[_Step]:
    """Every client's training images and labels stacked once on the device (uint8) and each
    step's batches gathered from them by one index table (clients, batch): no per-client
    Python and no host transfer in the loop. Clients whose batch sizes differ at a step
    (a short last batch, fewer samples) are bucketed by size, so no padding enters
    BatchNorm's statistics."""
    device = ctxs[0].device
    images = torch.cat([dense(ctx.train.x) for ctx in ctxs]).to(device)
    labels = torch.cat([ctx.train.y for ctx in ctxs]).to(device)
    starts = [0]
    for ctx in ctxs[:-1]:
        starts.append(starts[-1] + len(ctx.train))
    orders = [_batch_orders(ctx, epochs) for ctx in ctxs]
    plan: list[tuple[list[int], torch.Tensor]] = []  # (members, index table), on the CPU
    for step in range(max(len(batches) for batches in orders)):
        by_size: dict[int, list[int]] = {}
        for i, batches in enumerate(orders):
            if step < len(batches):
                by_size.setdefault(len(batches[step]), []).append(i)
        for members in by_size.values():
            table = torch.stack([orders[i][step] + starts[i] for i in members])
            plan.append((members, table))
    if not plan:
        return
    # one transfer for every table and member list
    tables = (
        torch.cat([t.flatten() for _, t in plan]).to(device).split([t.numel() for _, t in plan])
    )
    members_all = torch.tensor([i for m, _ in plan for i in m], device=device)
    member_index = members_all.split([len(m) for m, _ in plan])
    everyone = list(range(len(ctxs)))
    for (members, table), flat, index in zip(plan, tables, member_index, strict=True):
        rows = flat.view(table.shape)
        yield _Step(
            members,
            None if members == everyone else index,
            table.shape[1],
            to_input(images[rows], device),
            labels[rows],
        )


def _streamed_steps(ctxs: list[ClientContext], epochs: int) -> Iterator[_Step]:
    """The steps of clients whose batches are augmented (the augmentation draws from the
    client's generator between batches, so their batches are made one at a time, as
    :func:`~fedshift.algorithms.toolkit.fit` makes them), bucketed by batch size."""
    device = ctxs[0].device
    streams = [_trained_batches(ctx, epochs) for ctx in ctxs]
    live = list(range(len(ctxs)))
    while live:
        step: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for i in list(live):
            batch = next(streams[i], None)
            if batch is None:
                live.remove(i)
            else:
                step[i] = batch
        by_size: dict[int, list[int]] = {}
        for i, (x, _) in step.items():
            by_size.setdefault(len(x), []).append(i)
        for size, members in by_size.items():
            everyone = members == list(range(len(ctxs)))
            yield _Step(
                members,
                None if everyone else torch.tensor(members, device=device),
                size,
                torch.stack([step[i][0] for i in members]),
                torch.stack([step[i][1] for i in members]),
            )


def _trained_batches(
    ctx: ClientContext, epochs: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The batches :func:`~fedshift.algorithms.toolkit.fit` trains on, in its order."""
    for _ in range(epochs):
        for x, y in ctx.train.batches(ctx.train_cfg.batch_size, ctx.rng):
            if len(x) >= 2:
                yield x, y


def train_supervised_stacked(
    template: torch.nn.Module, ctxs: list[ClientContext], plans: list[SupervisedPlan]
) -> list[tuple[dict[str, torch.Tensor], dict[str, float]]]:
    """:func:`~fedshift.algorithms.toolkit.train_supervised` for every client at once;
    each client's trained state dict (CPU) and reply metrics. The loop holds no host sync:
    the losses are summed on the device and read once at the end."""
    cfg, device = ctxs[0].train_cfg, ctxs[0].device
    mu = plans[0].mu
    epochs = cfg.local_epochs if plans[0].epochs is None else plans[0].epochs
    # contiguous weights: a channels_last template (channels_last=auto on CUDA) stacked as it
    # is failed on CUDA ("NYI: querying is_contiguous inside of vmap for memory_format other
    # than torch.contiguous_format", first GPU window); the layout changes no value
    module = copy.deepcopy(template).to(device, memory_format=torch.contiguous_format).train()
    names = list(template.state_dict())
    trainable = [n for n, p in template.named_parameters() if p.requires_grad]
    frozen = [n for n, p in template.named_parameters() if not p.requires_grad]
    buffer_names = [n for n in names if n not in trainable and n not in frozen]

    def stacked(keys: list[str]) -> dict[str, torch.Tensor]:
        return {k: torch.stack([p.start[k].to(device) for p in plans]).contiguous() for k in keys}

    params = {k: v.requires_grad_(True) for k, v in stacked(trainable).items()}
    stack = _Stack(
        params=params,
        frozen=stacked(frozen),
        buffers=stacked(buffer_names),
        momentum={k: torch.zeros_like(v) for k, v in params.items()} if cfg.momentum else {},
        anchor={k: v.detach().clone() for k, v in params.items()} if mu > 0 else {},
    )

    def client_loss(params, frozen_params, buffers, x, y, anchor_params):
        out = functional_call(module, {**params, **frozen_params, **buffers}, (x,))
        loss = F.cross_entropy(out, y)
        if mu > 0:
            terms = [(params[n] - anchor_params[n]).pow(2).sum() for n in trainable]
            loss = loss + 0.5 * mu * torch.stack(terms).sum()
        return loss

    batched_loss = vmap(client_loss)
    augmented = any(ctx.train.augment is not None for ctx in ctxs)
    steps = (_streamed_steps if augmented else _resident_steps)(ctxs, epochs)
    loss_sums = torch.zeros(len(plans), dtype=torch.float64, device=device)
    seen = [0] * len(plans)
    everyone = torch.arange(len(plans), device=device)
    for step in steps:
        losses = _sgd_step(stack, step, batched_loss, cfg)
        index = everyone if step.index is None else step.index
        loss_sums.index_add_(0, index, losses.double() * step.size)
        for i in step.members:
            seen[i] += step.size
    every = {
        k: v.detach().to("cpu")
        for k, v in {**stack.params, **stack.frozen, **stack.buffers}.items()
    }
    sums = loss_sums.tolist()
    return [
        ({k: every[k][i].clone() for k in names}, local_metrics(ctx, seen[i], loss=sums[i]))
        for i, ctx in enumerate(ctxs)
    ]


def _sgd_step(stack: _Stack, step: _Step, batched_loss, cfg) -> torch.Tensor:
    """One SGD step of the clients ``step.members`` on their batches; their losses. The
    update is ``torch.optim.SGD``'s (no dampening, not Nesterov), as in-place ``_foreach``
    operations on the stacked tensors: a zero momentum buffer times momentum plus the
    gradient is the gradient, bit for bit, as SGD's first step makes it."""
    index = step.index
    if index is None:
        params, buffers = stack.params, stack.buffers  # BatchNorm updates these in place
        frozen, anchor = stack.frozen, stack.anchor
    else:

        def pick(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {k: v.detach().index_select(0, index) for k, v in tensors.items()}

        params = {k: v.requires_grad_(True) for k, v in pick(stack.params).items()}
        buffers, frozen, anchor = pick(stack.buffers), pick(stack.frozen), pick(stack.anchor)
    losses = batched_loss(params, frozen, buffers, step.x, step.y, anchor)
    weights = list(params.values())
    grads = list(torch.autograd.grad(losses.sum(), weights))
    with torch.no_grad():
        if cfg.weight_decay:
            torch._foreach_add_(grads, weights, alpha=cfg.weight_decay)
        update = grads
        if cfg.momentum:
            if index is None:
                update = list(stack.momentum.values())
            else:
                update = [stack.momentum[k].index_select(0, index) for k in params]
            torch._foreach_mul_(update, cfg.momentum)
            torch._foreach_add_(update, grads)
        torch._foreach_add_(weights, update, alpha=-cfg.lr)
        if index is not None:
            for key, value in params.items():
                stack.params[key].index_copy_(0, index, value)
            for key, value in buffers.items():
                stack.buffers[key].index_copy_(0, index, value)
            if cfg.momentum:
                for key, value in zip(params, update, strict=True):
                    stack.momentum[key].index_copy_(0, index, value)
    return losses.detach()
