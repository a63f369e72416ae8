"""A hand-made federated problem small enough to check by hand: two labeled clients of 2-pixel
images, a linear model, full-batch SGD, and one round run through the simulation engine.

Imported as ``from two_clients import ...`` (pytest's ``prepend`` import mode puts this folder
on ``sys.path`` for the test files beside it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fedshift.core.algorithm import Algorithm, RunInfo
from fedshift.core.context import ClientContext, SplitView, TrainConfig
from fedshift.core.state import ServerState
from fedshift.data.domains import Split
from fedshift.engine.simulation.dispatch import SimulationFederation

#: each client's images (uint8, 1x1x2: two pixels) and labels; 4 and 2 samples
CLIENT_DATA = {
    0: ([[0, 255], [255, 0], [64, 192], [128, 32]], [1, 0, 1, 0]),
    1: ([[200, 100], [16, 240]], [0, 1]),
}
#: the global model every client starts from: logits = W x + b for 2 classes
START = {
    "1.weight": torch.tensor([[0.3, -0.2], [-0.1, 0.4]]),
    "1.bias": torch.tensor([0.05, -0.05]),
}
#: run-level local training: two full-batch epochs of plain SGD with weight decay
TRAIN = TrainConfig(lr=0.5, momentum=0.0, weight_decay=0.01, batch_size=8, local_epochs=2)


def build_linear() -> nn.Module:
    """The clients' model: flatten the 2 pixels, one linear layer to 2 logits."""
    model = nn.Sequential(nn.Flatten(), nn.Linear(2, 2))
    model.load_state_dict(START)
    return model


def model_inputs(cid: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Client ``cid``'s data as the model sees it: pixels scaled to [-1, 1], labels."""
    pixels, labels = CLIENT_DATA[cid]
    return torch.tensor(pixels, dtype=torch.float32) / 127.5 - 1.0, torch.tensor(labels)


def contexts() -> dict[int, ClientContext]:
    """The two source clients (ids 0 and 1)."""
    out = {}
    for cid, (pixels, labels) in CLIENT_DATA.items():
        images = torch.tensor(pixels, dtype=torch.uint8).view(-1, 1, 1, 2)
        split = Split(x=images, y=torch.tensor(labels, dtype=torch.int64))
        out[cid] = ClientContext(
            client_id=cid,
            name=f"c{cid}",
            domain="d",
            role="source",
            train=SplitView(split, True, torch.device("cpu")),
            val=None,
            test=None,
            num_classes=2,
            build_model=build_linear,
            rng=torch.Generator().manual_seed(cid),
            device=torch.device("cpu"),
            train_cfg=TRAIN,
        )
    return out


def run_one_round(
    algorithm_cls: type[Algorithm], **hparams
) -> tuple[ServerState, dict[int, ClientContext]]:
    """One round of ``algorithm_cls`` on the two clients from :data:`START` (strict failure
    policy: a client error fails the test); the server state and the clients after it."""
    run = RunInfo(
        num_classes=2,
        build_model=build_linear,
        train_cfg=TRAIN,
        total_rounds=1,
        seed=0,
        device=torch.device("cpu"),
    )
    algorithm = algorithm_cls(algorithm_cls.Hparams(**hparams), run)
    clients = contexts()
    fed = SimulationFederation(algorithm, clients, seed=0, failure_policy="strict")
    state = algorithm.init_state()
    fed.begin_round(1)
    state, _ = algorithm.round(state, fed)
    return state, clients


def plain_sgd(
    cid: int, mu: float = 0.0, epochs: int = TRAIN.local_epochs
) -> dict[str, torch.Tensor]:
    """Client ``cid``'s weights after ``epochs`` (the run's local epochs) by a plain loop:
    w <- w - lr·(∇[CE(w) + μ/2·‖w − w_start‖²] + wd·w), one full batch per epoch."""
    x, y = model_inputs(cid)
    weight = START["1.weight"].clone().requires_grad_(True)
    bias = START["1.bias"].clone().requires_grad_(True)
    for _ in range(epochs):
        loss = F.cross_entropy(x @ weight.T + bias, y)
        pull = (weight - START["1.weight"]).pow(2).sum() + (bias - START["1.bias"]).pow(2).sum()
        loss = loss + 0.5 * mu * pull
        grad_w, grad_b = torch.autograd.grad(loss, (weight, bias))
        with torch.no_grad():
            weight -= TRAIN.lr * (grad_w + TRAIN.weight_decay * weight)
            bias -= TRAIN.lr * (grad_b + TRAIN.weight_decay * bias)
    return {"1.weight": weight.detach(), "1.bias": bias.detach()}


def sample_weighted_mean(models: dict[int, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """FedAvg's mean of client models weighted by their sample counts (4 and 2)."""
    counts = {cid: len(CLIENT_DATA[cid][1]) for cid in models}
    total = sum(counts.values())
    return {key: sum(models[cid][key] * counts[cid] / total for cid in models) for key in START}
