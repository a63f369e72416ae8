"""FedNova (Wang et al., NeurIPS 2020): normalized averaging for unequal local work."""

from __future__ import annotations

import logging

import torch

from fedshift.algorithms.toolkit import counting, model_from_record, model_record, train_supervised
from fedshift.core.algorithm import Algorithm, client_task
from fedshift.core.context import ClientContext, TrainConfig
from fedshift.core.federation import Federation
from fedshift.core.hparams import NoHparams
from fedshift.core.record import Kind, Record
from fedshift.core.reduce import RunningMean
from fedshift.core.state import ServerState

log = logging.getLogger(__name__)

Tensors = dict[str, torch.Tensor]


def normalizer(steps: int, momentum: float) -> float:
    """‖a_i‖₁ of ``steps`` local SGD steps with heavy-ball ``momentum`` ρ:
    ``(τ − ρ(1 − ρ^τ)/(1 − ρ)) / (1 − ρ)``, which is τ for plain SGD."""
    if momentum == 0.0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)


def highest_normalizer(cfg: TrainConfig, num_examples: int) -> float:
    """The largest ‖a_i‖₁ an honest client can report: one step per sample per epoch."""
    return normalizer(cfg.local_epochs * num_examples, momentum_of(cfg))


def momentum_of(cfg: TrainConfig) -> float:
    """The heavy-ball momentum of the run's local optimizer (0 for Adam, see the notes)."""
    return cfg.momentum if cfg.optimizer == "sgd" else 0.0


def normalized_update(sent: Tensors, trained: Tensors, a: float) -> Tensors:
    """``d_i = (x − y_i)/a_i`` on floating tensors (zero when no step was taken); integer
    buffers are carried as the client's value, to be averaged as in FedAvg."""
    out = {}
    for key, x in sent.items():
        if not x.is_floating_point():
            out[key] = trained[key]
        elif a > 0:
            out[key] = (x - trained[key]) / a
        else:
            out[key] = torch.zeros_like(x)
    return out


def server_update(sent: Tensors, mean_update: Tensors, tau_eff: float) -> Tensors:
    """``x ← x − τ_eff·Σ p_i·d_i`` on floating tensors; integer buffers take the mean."""
    return {
        k: x - tau_eff * mean_update[k] if x.is_floating_point() else mean_update[k]
        for k, x in sent.items()
    }


class FedNova(Algorithm):
    """FedNova: every client runs the run's local SGD (however many steps its data gives)
    and reports its model y_i and the normalizer ``a_i = ‖a_i‖₁`` of the steps it took
    (τ_i for plain SGD, the heavy-ball sum for momentum ρ). The server forms
    ``d_i = (x − y_i)/a_i`` and steps ``x ← x − τ_eff·Σ p_i·d_i`` with ``p_i = n_i/Σn`` and
    ``τ_eff = Σ p_i·a_i``, removing the bias of FedAvg towards clients that take more steps.

    No state beyond the model. A reply whose normalizer is neither 0 (no step) nor in
    [1, what ``local_epochs`` passes of one-sample steps give] is left out of the mean
    (round metric ``refused_normalizers``). Integer buffers (BatchNorm
    ``num_batches_tracked``) take FedAvg's rounded mean; BatchNorm running statistics follow
    the normalized rule, as in NIID-Bench.

    Reference: NIID-Bench (Li et al., ICDE 2022, ``train_net_fednova`` and its server
    loop). Deviation notes: the weight-decay and proximal corrections of the official
    FedNova code's ``local_normalizing_vec`` are not applied (NIID-Bench also leaves them
    out); with Adam as local optimizer the normalizer is τ_i (no closed form exists).
    """

    name = "fednova"
    paper = (
        "Wang et al., Tackling the Objective Inconsistency Problem in Heterogeneous "
        "Federated Optimization, NeurIPS 2020"
    )
    Hparams = NoHparams
    shares = {"model": Kind.MODEL}

    def round(self, state: ServerState, fed: Federation):
        sent = state.model
        cfg = self.run.train_cfg
        updates, weights, held = RunningMean(), [], []
        weighted_normalizer = [0.0]
        losses: list[tuple[float, float]] = []
        refused = [0]
        robust = not self.run.aggregator.is_mean

        def fold(cid: int, reply: Record) -> None:
            n = reply.metrics["num-examples"]
            a = float(reply.metrics.get("normalizer", -1.0))
            if not (a == 0.0 or 1.0 <= a <= highest_normalizer(cfg, n)):
                log.warning("client %s reported normalizer %r: left out of FedNova's mean", cid, a)
                refused[0] += 1
                reply.take("model")
                return
            update = normalized_update(sent, reply.take("model"), a)
            if robust:
                held.append(update)
            else:
                updates.add(update, n)
            weights.append(n)
            weighted_normalizer[0] += n * a
            losses.append((float(reply.metrics["loss"]), n))

        fed.call("train", fed.sample(), Record().with_arrays("model", sent), fold=fold)
        metrics = {
            "train_loss": sum(v * w for v, w in losses) / sum(w for _, w in losses)
            if losses
            else float("nan"),
            "refused_normalizers": float(refused[0]),
        }
        if weights:
            mean = self.run.aggregator(held, weights) if robust else updates.result()
            state.model = server_update(sent, mean, weighted_normalizer[0] / sum(weights))
        return state, metrics

    @client_task("train")
    def train(self, ctx: ClientContext, record: Record) -> Record:
        model = model_from_record(ctx, record)
        penalty, steps = counting(lambda _: torch.zeros((), device=ctx.device))
        metrics = train_supervised(model, ctx, penalty=penalty)
        reply = model_record(model)
        reply.metrics.update(metrics)
        reply.metrics["normalizer"] = normalizer(steps[0], momentum_of(ctx.train_cfg))
        return reply
