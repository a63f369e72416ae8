"""FedDyn (Acar et al., ICLR 2021): federated learning with dynamic regularization."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedshift.algorithms.toolkit import (
    call_and_average,
    linear_penalty,
    model_from_record,
    model_record,
    proximal_penalty,
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
class FedDynHparams(BaseHparams):
    alpha: float = hp(
        0.01,
        "α",
        "weight of the dynamic regularizer; the paper picks it from {0.1, 0.01, 0.001} and the "
        "official CIFAR-10 example uses 0.01",
        low=0,
        low_open=True,
        search=log_uniform(1e-3, 0.1),
    )


def local_penalty(anchor: Tensors, history: Tensors, alpha: float):
    """The client's regularizer ``α/2·‖θ − θ_s‖² + α·⟨θ, λ_k⟩`` (``λ_k = −∇L_k/α``, the sum
    of its past drifts): the same gradient ``α(θ − θ_s) + α·λ_k`` as the official code's
    ``α·⟨θ, λ_k − θ_s⟩`` plus weight decay α."""
    pull = proximal_penalty(anchor, alpha)
    linear = linear_penalty({k: alpha * v for k, v in history.items()})
    return lambda model: pull(model) + linear(model)


def server_update(
    mean_model: Tensors, drift_sum: Tensors, sent: Tensors, replied: int, clients: int
) -> tuple[Tensors, Tensors]:
    """``Σλ ← Σλ + Σ_{k∈P}(θ_k − θ_s)`` and ``θ ← mean_P(θ_k) + Σλ / N`` (the paper's
    ``h``, as ``−α·Σλ/N``); tensors outside the regularizer (BatchNorm buffers) take the
    mean (integers rounded, as in FedAvg)."""
    new_sum = {k: drift_sum[k] + replied * (mean_model[k] - sent[k]) for k in drift_sum}
    model = {
        k: mean_model[k] + new_sum[k] / clients if k in new_sum else mean_model[k]
        for k in mean_model
    }
    return model, new_sum


class FedDyn(Algorithm):
    """FedDyn: client k minimizes ``L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + α/2·‖θ − θ^{t−1}‖²``
    from the server model θ^{t−1}; the gradient history is kept as ``λ_k`` (so that
    ``∇L_k = −α·λ_k``) and grows by ``θ_k − θ^{t−1}`` after each local training. The server
    keeps ``Σλ`` over all clients (the paper's ``h = −α·Σλ/N``) and sends
    ``θ^t = mean(θ_k) + Σλ/N``.

    Where the state lives: ``λ_k`` in ``ctx.state["drift"]`` and ``Σλ`` in
    ``state.extra["drift_sum"]``, both checkpointed; they cover trainable parameters only
    (BatchNorm running statistics and counters take the plain mean).

    Reference: the official code (github.com/alpemreacar/FedDyn, ``train_FedDyn`` and
    ``train_feddyn_mdl``). Deviation notes: the official code scales α per client by its
    share of the data (α·Σn/(N·n_k)); fedshift uses α for every client (the same with
    equal-sized clients); it clips gradients at norm 10 and decays the learning rate per
    round, fedshift uses the run's optimizer as is; it reports the plain mean of the active
    clients' models, fedshift evaluates the paper's server model θ^t.
    """

    name = "feddyn"
    paper = "Acar et al., Federated Learning Based on Dynamic Regularization, ICLR 2021"
    Hparams = FedDynHparams
    shares = {"model": Kind.MODEL}

    def init_state(self) -> ServerState:
        net = self.build_net()
        model = {k: v.detach().clone() for k, v in net.state_dict().items()}
        return ServerState(model=model, extra={"drift_sum": trainable_tensors(net)})

    def round(self, state: ServerState, fed: Federation):
        sent = state.model
        replies, means = call_and_average(
            fed, Record().with_arrays("model", sent), self.run.aggregator, uniform=True
        )
        if replies:
            state.model, state.extra["drift_sum"] = server_update(
                means["model"], state.extra["drift_sum"], sent, len(replies), len(fed.clients())
            )
        return state, {"train_loss": weighted_metric(replies, "loss")}

    @client_task("train")
    def train(self, ctx: ClientContext, record: Record) -> Record:
        model = model_from_record(ctx, record)
        sent = record.subset("model")
        history = ctx.state.get("drift") or trainable_tensors(model)
        anchor = {k: v.to(ctx.device) for k, v in sent.items()}
        on_device = {k: v.to(ctx.device) for k, v in history.items()}
        metrics = train_supervised(
            model, ctx, penalty=local_penalty(anchor, on_device, self.hp.alpha)
        )
        trained = state_dict_cpu(model)
        ctx.state["drift"] = {k: history[k] + (trained[k] - sent[k]) for k in history}
        reply = model_record(model)
        reply.metrics.update(metrics)
        return reply
