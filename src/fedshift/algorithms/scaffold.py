"""SCAFFOLD (Karimireddy et al., ICML 2020): local steps corrected by control variates."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedshift.algorithms.toolkit import (
    call_and_average,
    counting,
    linear_penalty,
    model_from_record,
    model_record,
    state_dict_cpu,
    train_supervised,
    trainable_tensors,
    weighted_metric,
)
from fedshift.core.algorithm import Algorithm, client_task
from fedshift.core.context import ClientContext
from fedshift.core.federation import Federation
from fedshift.core.hparams import BaseHparams, hp, log_uniform
from fedshift.core.record import Kind, Record
from fedshift.core.state import ServerState

Tensors = dict[str, torch.Tensor]


@dataclass(frozen=True)
class ScaffoldHparams(BaseHparams):
    server_lr: float = hp(
        1.0,
        "η_g",
        "global (server) step size: x ← x + η_g·mean(y_i − x); the paper's experiments and "
        "FL-bench use 1",
        low=0,
        low_open=True,
        search=log_uniform(0.1, 3.0),
    )


def control_update(
    c_local: Tensors, c_global: Tensors, sent: Tensors, trained: Tensors, steps: int, lr: float
) -> Tensors:
    """Option II: ``c_i⁺ = c_i − c + (x − y_i) / (K·η_l)`` (K local steps at step size η_l);
    a client that took no step keeps ``c_i``."""
    if steps == 0:
        return {k: v.clone() for k, v in c_local.items()}
    scale = 1.0 / (steps * lr)
    return {k: c_local[k] - c_global[k] + (sent[k] - trained[k]) * scale for k in c_local}


def server_update(
    model: Tensors,
    control: Tensors,
    mean_model: Tensors,
    mean_control_delta: Tensors,
    replied: int,
    clients: int,
    server_lr: float,
) -> tuple[Tensors, Tensors]:
    """``x ← x + η_g·mean(y_i − x)`` on floating tensors (integer buffers: the plain mean, as
    FedAvg rounds it) and ``c ← c + (1/N)·Σ Δc_i`` over the |S| replies of N clients."""
    new_model = {
        k: model[k] + server_lr * (mean_model[k] - model[k])
        if v.is_floating_point()
        else mean_model[k]
        for k, v in model.items()
    }
    share = replied / clients
    new_control = {k: control[k] + share * mean_control_delta[k] for k in control}
    return new_model, new_control


class Scaffold(Algorithm):
    """SCAFFOLD, option II. Each round the server sends the global model x and the server
    control variate c; client i takes its local SGD steps on CE with every gradient
    corrected by ``c − c_i`` (its own control variate, zero at first), then sets
    ``c_i⁺ = c_i − c + (x − y_i)/(K·η_l)`` and replies its model y_i and
    ``Δc_i = c_i⁺ − c_i``. The server steps ``x ← x + η_g·mean(y_i − x)`` and
    ``c ← c + (1/N)·Σ Δc_i`` (N: all source clients).

    Where the state lives: c in ``state.extra["control"]`` and c_i in
    ``ctx.state["control"]``, both checkpointed. Control variates cover trainable parameters
    only; BatchNorm running statistics follow the same server step as the weights, and
    integer buffers (``num_batches_tracked``) take the rounded mean, as in FedAvg.

    Reference: FL-bench's ``SCAFFOLDClient``/``SCAFFOLDServer`` (the paper's authors did not
    publish code). Deviation notes: K is the number of local steps taken (the run's
    ``local_epochs`` passes over the client's batches; FL-bench and the paper fix K) and η_l
    is the run's ``lr``; the run's optimizer is used as is (SGD with momentum by default,
    where the paper analyses plain SGD: ``--set momentum=0`` gives the paper's setting);
    the mean over replies is unweighted, as in the paper and FL-bench; no gradient clipping.
    """

    name = "scaffold"
    paper = (
        "Karimireddy et al., SCAFFOLD: Stochastic Controlled Averaging for Federated "
        "Learning, ICML 2020"
    )
    Hparams = ScaffoldHparams
    shares = {"model": Kind.MODEL, "control": Kind.MODEL}

    def init_state(self) -> ServerState:
        net = self.build_net()
        model = {k: v.detach().clone() for k, v in net.state_dict().items()}
        return ServerState(model=model, extra={"control": trainable_tensors(net)})

    def round(self, state: ServerState, fed: Federation):
        control = state.extra["control"]
        sent = Record().with_arrays("model", state.model).with_arrays("control", control)
        replies, means = call_and_average(
            fed, sent, self.run.aggregator, ("model", "control"), uniform=True
        )
        if replies:
            state.model, state.extra["control"] = server_update(
                state.model,
                control,
                means["model"],
                means["control"],
                len(replies),
                len(fed.clients()),
                self.hp.server_lr,
            )
        return state, {"train_loss": weighted_metric(replies, "loss")}

    @client_task("train")
    def train(self, ctx: ClientContext, record: Record) -> Record:
        model = model_from_record(ctx, record)
        c_global = record.subset("control")
        c_local = ctx.state.get("control") or {k: torch.zeros_like(v) for k, v in c_global.items()}
        correction = {k: (c_global[k] - c_local[k]).to(ctx.device) for k in c_global}
        penalty, steps = counting(linear_penalty(correction))
        metrics = train_supervised(model, ctx, penalty=penalty)
        trained = state_dict_cpu(model)
        sent = record.subset("model")
        c_new = control_update(c_local, c_global, sent, trained, steps[0], ctx.train_cfg.lr)
        ctx.state["control"] = c_new
        reply = model_record(model).with_arrays(
            "control", {k: c_new[k] - c_local[k] for k in c_new}
        )
        reply.metrics.update(metrics)
        return reply
