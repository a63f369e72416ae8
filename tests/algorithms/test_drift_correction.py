"""SCAFFOLD, FedDyn and FedNova on the hand-made two-client problem, checked against
transcriptions of reference code run on the same data in plain PyTorch:

- SCAFFOLD: FL-bench (KarhouTam/FL-bench, ``src/client/scaffold.py``, ``src/server/
  scaffold.py``): the gradient gets ``c − c_i`` added before the optimizer step; option II's
  ``c_i⁺ = c_i − c − (y − x)/(K·η_l)``; ``x += η_g·mean(y − x)``, ``c += Σ Δc_i / N``.
- FedDyn: the official code (alpemreacar/FedDyn, ``train_feddyn_mdl`` and ``train_FedDyn``):
  SGD with weight decay α + wd on ``CE + α·⟨θ, λ_k − θ_s⟩`` with gradients clipped at norm
  10, ``λ_k += θ_k − θ_s``, ``θ_s = mean_P(θ_k) + mean_all(λ)``; with α the same for every
  client (the official per-client scaling is a deviation note).
- FedNova: NIID-Bench (Xtra-Computing/NIID-Bench, ``train_net_fednova`` and its server
  loop): ``a_i = (τ − ρ(1 − ρ^τ)/(1 − ρ))/(1 − ρ)``, ``d_i = (x − y_i)/a_i``,
  ``x −= (Σ p_i a_i)·Σ p_i d_i`` with ``p_i = n_i/Σn``; here with momentum 0.9 and mini-batches
  of 2, so the clients take 4 and 2 steps.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from two_clients import CLIENT_DATA, START, TRAIN, build_linear, contexts, model_inputs

from fedshift.algorithms.feddyn import FedDyn
from fedshift.algorithms.fednova import FedNova, normalizer
from fedshift.algorithms.scaffold import Scaffold
from fedshift.core.algorithm import RunInfo
from fedshift.core.record import Record
from fedshift.core.seeding import derive_seed
from fedshift.engine.simulation.dispatch import SimulationFederation

KEYS = ("1.weight", "1.bias")
#: the transcriptions' parameter names for the linear model's weight and bias
W, B = KEYS


def run_rounds(cls, rounds: int, train_cfg=TRAIN, **hparams):
    """``rounds`` rounds of ``cls`` on the two clients (strict failure policy)."""
    run = RunInfo(
        num_classes=2,
        build_model=build_linear,
        train_cfg=train_cfg,
        total_rounds=rounds,
        seed=0,
        device=torch.device("cpu"),
    )
    algorithm = cls(cls.Hparams(**hparams), run)
    clients = contexts()
    for ctx in clients.values():
        ctx.train_cfg = train_cfg
    fed = SimulationFederation(algorithm, clients, seed=0, failure_policy="strict")
    state = algorithm.init_state()
    for round_ in range(1, rounds + 1):
        fed.begin_round(round_)
        state, metrics = algorithm.round(state, fed)
    return state, clients, metrics


def ce_grad(cid: int, params: dict[str, torch.Tensor], rows=None):
    """∇CE of client ``cid``'s samples (``rows``: a mini-batch) at ``params``."""
    x, y = model_inputs(cid)
    if rows is not None:
        x, y = x[rows], y[rows]
    leaves = {k: v.clone().requires_grad_(True) for k, v in params.items()}
    loss = F.cross_entropy(x @ leaves[W].T + leaves[B], y)
    grads = torch.autograd.grad(loss, [leaves[k] for k in KEYS])
    return dict(zip(KEYS, grads, strict=True))


# -- SCAFFOLD, transcribed from FL-bench ---------------------------------------------------


def flbench_scaffold(rounds: int, global_lr: float):
    x = {k: START[k].clone() for k in KEYS}
    c_global = {k: torch.zeros_like(v) for k, v in x.items()}
    c_local = {cid: {k: torch.zeros_like(v) for k, v in x.items()} for cid in CLIENT_DATA}
    steps = TRAIN.local_epochs  # full batch: one step per epoch
    for _ in range(rounds):
        y_deltas, c_deltas = [], []
        for cid in CLIENT_DATA:
            y = {k: v.clone() for k, v in x.items()}
            for _ in range(steps):
                grad = ce_grad(cid, y)
                for k in KEYS:  # param.grad += c - c_i, then SGD with weight decay
                    g = grad[k] + (c_global[k] - c_local[cid][k]) + TRAIN.weight_decay * y[k]
                    y[k] = y[k] - TRAIN.lr * g
            coef = 1 / (steps * TRAIN.lr)
            y_delta = {k: y[k] - x[k] for k in KEYS}
            c_plus = {k: c_local[cid][k] - c_global[k] - coef * y_delta[k] for k in KEYS}
            c_deltas.append({k: c_plus[k] - c_local[cid][k] for k in KEYS})
            c_local[cid] = c_plus
            y_deltas.append(y_delta)
        for k in KEYS:
            x[k] = x[k] + global_lr * sum(d[k] for d in y_deltas) / len(y_deltas)
            c_global[k] = c_global[k] + sum(d[k] for d in c_deltas) / len(CLIENT_DATA)
    return x, c_global, c_local


@pytest.mark.parametrize("server_lr", [1.0, 0.5])
def test_scaffold_equals_flbench_over_two_rounds(server_lr):
    state, clients, _ = run_rounds(Scaffold, 2, server_lr=server_lr)
    x, c_global, c_local = flbench_scaffold(2, server_lr)
    for k in KEYS:
        torch.testing.assert_close(state.model[k], x[k], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(state.extra["control"][k], c_global[k], atol=1e-6, rtol=1e-6)
        for cid, ctx in clients.items():
            torch.testing.assert_close(
                ctx.state["control"][k], c_local[cid][k], atol=1e-6, rtol=1e-6
            )
    # the control variates are not zero: round 2 is corrected
    assert state.extra["control"][W].abs().max() > 1e-3


# -- FedDyn, transcribed from the official code ---------------------------------------------


def official_feddyn(rounds: int, alpha: float):
    server = {k: START[k].clone() for k in KEYS}
    history = {cid: {k: torch.zeros_like(v) for k, v in server.items()} for cid in CLIENT_DATA}
    for _ in range(rounds):
        trained = {}
        for cid in CLIENT_DATA:
            theta = {k: v.clone().requires_grad_(True) for k, v in server.items()}
            optimizer = torch.optim.SGD(
                [theta[k] for k in KEYS], lr=TRAIN.lr, weight_decay=alpha + TRAIN.weight_decay
            )
            x, y = model_inputs(cid)
            for _ in range(TRAIN.local_epochs):
                loss_f = F.cross_entropy(x @ theta[W].T + theta[B], y)
                flat = torch.cat([theta[k].reshape(-1) for k in KEYS])
                direction = torch.cat([(history[cid][k] - server[k]).reshape(-1) for k in KEYS])
                loss = loss_f + alpha * torch.sum(flat * direction)
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_([theta[k] for k in KEYS], max_norm=10)
                optimizer.step()
            trained[cid] = {k: v.detach() for k, v in theta.items()}
            for k in KEYS:
                history[cid][k] = history[cid][k] + trained[cid][k] - server[k]
        server = {
            k: sum(t[k] for t in trained.values()) / len(trained)
            + sum(h[k] for h in history.values()) / len(history)
            for k in KEYS
        }
    return server, history


@pytest.mark.parametrize("alpha", [0.01, 0.5])
def test_feddyn_equals_the_official_code_over_three_rounds(alpha):
    state, clients, _ = run_rounds(FedDyn, 3, alpha=alpha)
    server, history = official_feddyn(3, alpha)
    for k in KEYS:
        torch.testing.assert_close(state.model[k], server[k], atol=1e-6, rtol=1e-5)
        for cid, ctx in clients.items():
            torch.testing.assert_close(ctx.state["drift"][k], history[cid][k], atol=1e-6, rtol=1e-5)
    assert history[0][W].abs().max() > 1e-3


# -- FedNova, transcribed from NIID-Bench ---------------------------------------------------

NOVA_TRAIN = dataclasses.replace(TRAIN, momentum=0.9, batch_size=2)


def niid_bench_fednova():
    x = {k: START[k].clone() for k in KEYS}
    rho = NOVA_TRAIN.momentum
    norm_grads, a_list, ratios = [], [], []
    total = sum(len(labels) for _, labels in CLIENT_DATA.values())
    for cid in CLIENT_DATA:
        net = {k: v.clone().requires_grad_(True) for k, v in x.items()}
        optimizer = torch.optim.SGD(
            [net[k] for k in KEYS],
            lr=NOVA_TRAIN.lr,
            momentum=rho,
            weight_decay=NOVA_TRAIN.weight_decay,
        )
        # the client's batch order, drawn as fedshift's engine seeds it (seed 0, round 1, call 0)
        rng = torch.Generator().manual_seed(derive_seed(0, "client", cid, 1, 0))
        inputs, labels = model_inputs(cid)
        tau = 0
        for _ in range(NOVA_TRAIN.local_epochs):
            order = torch.randperm(len(labels), generator=rng)
            for start in range(0, len(labels), NOVA_TRAIN.batch_size):
                rows = order[start : start + NOVA_TRAIN.batch_size]
                loss = F.cross_entropy(inputs[rows] @ net[W].T + net[B], labels[rows])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                tau += 1
        a_i = (tau - rho * (1 - pow(rho, tau)) / (1 - rho)) / (1 - rho)
        norm_grads.append({k: (x[k] - net[k].detach()) / a_i for k in KEYS})
        a_list.append(a_i)
        ratios.append(len(labels) / total)
    d_total = {k: sum(r * g[k] for r, g in zip(ratios, norm_grads, strict=True)) for k in KEYS}
    coeff = sum(a * r for a, r in zip(a_list, ratios, strict=True))
    return {k: x[k] - coeff * d_total[k] for k in KEYS}, a_list


def test_fednova_equals_niid_bench_with_momentum_and_unequal_steps():
    state, _, metrics = run_rounds(FedNova, 1, train_cfg=NOVA_TRAIN)
    expected, a_list = niid_bench_fednova()
    assert a_list == [normalizer(4, 0.9), normalizer(2, 0.9)]  # 4 and 2 local steps
    for k in KEYS:
        torch.testing.assert_close(state.model[k], expected[k], atol=1e-6, rtol=1e-5)
    assert metrics["refused_normalizers"] == 0.0


def test_normalizer_by_hand():
    assert normalizer(3, 0.0) == 3.0
    # ρ = 0.5, τ = 2: (1) + (1 + 0.5) = 2.5
    assert normalizer(2, 0.5) == pytest.approx(2.5, abs=1e-12)


@pytest.mark.parametrize("claimed", [0.5, 1e9, -1.0])
def test_fednova_leaves_out_a_reply_with_an_impossible_normalizer(claimed, monkeypatch):
    """Fault injection: client 1 reports a normalizer no honest client can have; the round
    is then client 0's alone (x − a_0·d_0 = its own model) and the refusal is counted."""
    original = FedNova.train

    def lying(self, ctx, record: Record) -> Record:
        reply = original(self, ctx, record)
        if ctx.client_id == 1:
            reply.metrics["normalizer"] = claimed
        return reply

    monkeypatch.setattr(FedNova, "train", lying)
    state, _, metrics = run_rounds(FedNova, 1)
    assert metrics["refused_normalizers"] == 1.0
    monkeypatch.setattr(FedNova, "train", original)
    honest, _, _ = run_rounds(FedNova, 1)
    # client 0's own model: FedNova with one client is that client's model
    x, y = model_inputs(0)
    weight, bias = START[W].clone(), START[B].clone()
    for _ in range(TRAIN.local_epochs):
        w, b = weight.requires_grad_(True), bias.requires_grad_(True)
        loss = F.cross_entropy(x @ w.T + b, y)
        gw, gb = torch.autograd.grad(loss, (w, b))
        with torch.no_grad():
            weight = w - TRAIN.lr * (gw + TRAIN.weight_decay * w)
            bias = b - TRAIN.lr * (gb + TRAIN.weight_decay * b)
    torch.testing.assert_close(state.model[W], weight.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(state.model[B], bias.detach(), atol=1e-6, rtol=1e-5)
    assert not torch.allclose(honest.model[W], state.model[W])  # both clients count
