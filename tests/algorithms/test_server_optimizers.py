"""FedAvgM, FedAdagrad, FedAdam and FedYogi against Flower 1.41's strategies of the same
names: the same hand-made client models and weights, three rounds, fed to Flower's
``aggregate_train`` and to fedshift's server step, give the same new models to float
precision; integer buffers take FedAvg's rounded mean (Flower turns them into floats)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedshift.algorithms.fedadagrad import FedAdagrad
from fedshift.algorithms.fedadam import FedAdam
from fedshift.algorithms.fedavgm import FedAvgM
from fedshift.algorithms.fedyogi import FedYogi
from fedshift.core.algorithm import RunInfo
from fedshift.core.context import TrainConfig
from fedshift.core.federation import Federation, fold_all
from fedshift.core.hparams import make_hparams
from fedshift.core.record import Record
from fedshift.core.state import ServerState

flwr = pytest.importorskip("flwr", reason="flwr is not installed; pip install -e '.[flower]'")
np = pytest.importorskip("numpy")
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict  # noqa: E402
from flwr.serverapp import strategy as flower  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

#: the global model: two floating tensors and a BatchNorm counter
START = {
    "w": torch.tensor([[0.5, -1.0, 0.25], [2.0, 0.0, -0.5]]),
    "b": torch.tensor([0.1, -0.2, 0.3]),
    "bn.num_batches_tracked": torch.tensor(10),
}
#: three clients' sample counts (the aggregation weights)
COUNTS = [3, 1, 4]
ROUNDS = 3


def client_models(round_: int) -> list[dict[str, torch.Tensor]]:
    """Hand-made replies of round ``round_``: fixed offsets from START, different per round."""
    out = []
    for i, _ in enumerate(COUNTS):
        shift = 0.1 * (i + 1) * (-1) ** (round_ + i) + 0.05 * round_
        out.append(
            {
                "w": START["w"] + shift * torch.tensor([[1.0, -2.0, 0.5], [0.25, 1.0, -1.0]]),
                "b": START["b"] - shift * torch.tensor([1.0, 0.5, -3.0]),
                "bn.num_batches_tracked": torch.tensor(10 + 5 * round_ + i),
            }
        )
    return out


class HandFederation(Federation):
    """Three clients whose ``train`` replies are :func:`client_models` of the round."""

    def clients(self, role: str = "source") -> list[int]:
        return list(range(len(COUNTS)))

    def sample(self, k=None, role="source") -> list[int]:
        return self.clients()

    def call(self, task, ids, record, fold=None):
        replies = {}
        for cid, model in zip(ids, client_models(self.round), strict=True):
            reply = Record().with_arrays("model", model)
            reply.metrics.update({"num-examples": COUNTS[cid], "loss": 1.0})
            replies[cid] = reply
        return fold_all(replies, fold)


def fedshift_models(cls, **hparams) -> list[dict[str, torch.Tensor]]:
    """fedshift's global model after each of :data:`ROUNDS` rounds."""
    run = RunInfo(
        num_classes=2,
        build_model=lambda: nn.Linear(1, 1),
        train_cfg=TrainConfig(),
        total_rounds=ROUNDS,
        seed=0,
        device=torch.device("cpu"),
    )
    algorithm = cls(make_hparams(cls.Hparams, hparams, cls.name), run)
    state = ServerState(model={k: v.clone() for k, v in START.items()})
    fed = HandFederation()
    out = []
    for round_ in range(1, ROUNDS + 1):
        fed.round = round_
        state, _ = algorithm.round(state, fed)
        out.append(dict(state.model))
    return out


def flower_models(strategy, *, fedopt: bool) -> list[dict[str, np.ndarray]]:
    """Flower's global model after each round: ``aggregate_train`` on the same replies,
    the strategy's current arrays set as its ``configure_train`` sets them."""
    current = ArrayRecord({k: Array(v.numpy()) for k, v in START.items()})
    if not fedopt:
        strategy.current_arrays = current  # FedAvgM keeps its own copy after round 1
    out = []
    for round_ in range(1, ROUNDS + 1):
        if fedopt:
            strategy.current_arrays = {k: a.numpy() for k, a in current.items()}
        replies = [
            Message(
                RecordDict(
                    {
                        "arrays": ArrayRecord({k: Array(v.numpy()) for k, v in model.items()}),
                        "metrics": MetricRecord({"num-examples": n}),
                    }
                ),
                dst_node_id=100 + i,
                message_type="train",
            )
            for i, (model, n) in enumerate(zip(client_models(round_), COUNTS, strict=True))
        ]
        current, _ = strategy.aggregate_train(round_, replies)
        out.append({k: a.numpy() for k, a in current.items()})
    return out


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
    """Messages are created inside a ServerApp process, whose identity Flower sets."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


def adagrad_with_momentum():
    """Flower's FedAdagrad fixes β1 = 0; the paper (and fedshift's default) uses 0.9."""
    strategy = flower.FedAdagrad(eta=0.1, tau=1e-3)
    strategy.beta_1 = 0.9
    return strategy


CASES = {
    "fedavgm": (FedAvgM, {}, lambda: flower.FedAvgM(server_learning_rate=1.0, server_momentum=0.9)),
    "fedavgm-lr": (
        FedAvgM,
        {"server_lr": 0.7, "server_momentum": 0.5},
        lambda: flower.FedAvgM(server_learning_rate=0.7, server_momentum=0.5),
    ),
    "fedadagrad": (FedAdagrad, {}, adagrad_with_momentum),
    "fedadagrad-flower": (FedAdagrad, {"beta1": 0.0}, lambda: flower.FedAdagrad()),
    "fedadam": (
        FedAdam,
        {"bias_correction": True},
        lambda: flower.FedAdam(eta=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3),
    ),
    "fedyogi": (
        FedYogi,
        {},
        lambda: flower.FedYogi(eta=0.01, beta_1=0.9, beta_2=0.99, tau=1e-3),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_server_step_equals_flower_strategy(case):
    cls, hparams, make_strategy = CASES[case]
    ours = fedshift_models(cls, **hparams)
    theirs = flower_models(make_strategy(), fedopt=cls is not FedAvgM)
    for round_, (mine, flowers) in enumerate(zip(ours, theirs, strict=True), start=1):
        for key in ("w", "b"):
            expected = torch.from_numpy(np.asarray(flowers[key])).to(torch.float32)
            torch.testing.assert_close(mine[key], expected, rtol=1e-5, atol=1e-6)
        # the BatchNorm counter: FedAvg's rounded weighted mean, still an integer
        counter = mine["bn.num_batches_tracked"]
        assert counter.dtype == torch.int64
        mean = sum(
            int(m["bn.num_batches_tracked"]) * n
            for m, n in zip(client_models(round_), COUNTS, strict=True)
        ) / sum(COUNTS)
        assert int(counter) == round(mean)
    # and the server step did something: the result is not FedAvg's mean
    fedavg_w = sum(m["w"] * n for m, n in zip(client_models(ROUNDS), COUNTS, strict=True)) / sum(
        COUNTS
    )
    assert (ours[-1]["w"] - fedavg_w).abs().max() > 1e-3


def test_adam_without_bias_correction_is_the_papers_rule():
    """Round 1 by hand: m = 0.1·Δ, v = 0.01·Δ², x + 0.1·m/(√v + τ)."""
    (first, *_) = fedshift_models(FedAdam)
    mean = sum(m["b"] * n for m, n in zip(client_models(1), COUNTS, strict=True)) / sum(COUNTS)
    delta = mean - START["b"]
    expected = START["b"] + 0.1 * (0.1 * delta) / ((0.01 * delta**2).sqrt() + 1e-3)
    torch.testing.assert_close(first["b"], expected, rtol=1e-6, atol=1e-7)


def test_moments_are_server_state_and_a_round_without_replies_keeps_them():
    run = RunInfo(
        num_classes=2,
        build_model=lambda: nn.Linear(1, 1),
        train_cfg=TrainConfig(),
        total_rounds=2,
        seed=0,
        device=torch.device("cpu"),
    )
    algorithm = FedYogi(FedYogi.Hparams(), run)
    state = ServerState(model={k: v.clone() for k, v in START.items()})
    fed = HandFederation()
    fed.round = 1
    state, _ = algorithm.round(state, fed)
    assert set(state.extra) == {"first_moment", "second_moment"}
    assert set(state.extra["first_moment"]) == {"w", "b"}  # no moment for the counter
    before = {k: v.clone() for k, v in state.model.items()}

    class Silent(HandFederation):
        def call(self, task, ids, record, fold=None):
            return {}

    state, metrics = algorithm.round(state, Silent())
    for key, value in before.items():
        assert torch.equal(state.model[key], value)
