"""Local training: every client trains alone; nothing is communicated."""

from __future__ import annotations

from typing import Any

import torch

from fedshift.algorithms.toolkit import state_dict_cpu, train_supervised, weighted_metric
from fedshift.core.algorithm import Algorithm, SupervisedPlan, client_task
from fedshift.core.context import ClientContext
from fedshift.core.federation import Federation
from fedshift.core.hparams import NoHparams
from fedshift.core.record import Record
from fedshift.core.state import ServerState


class Local(Algorithm):
    """Each client trains its own model on its own data for E epochs per round.

    The lower reference of federated learning. Every client starts from the same seeded
    initialization (a shared seed, not a message). Evaluated per client: on a held-out
    domain the reported accuracy is the mean over the clients' models.
    """

    name = "local"
    paper = "baseline (no communication)"
    Hparams = NoHparams
    shares = {}
    personal = True
    batchable = ("train",)

    def init_state(self) -> ServerState:
        return ServerState()

    def round(self, state: ServerState, fed: Federation):
        replies = fed.call("train", fed.sample(), Record())
        return state, {"train_loss": weighted_metric(replies, "loss")}

    def client_model(self, client_state: dict[str, Any]) -> torch.nn.Module | None:
        if "model" not in client_state:
            return None
        model = self.run.build_model()
        model.load_state_dict(client_state["model"])
        return model

    def batch_plan(self, task: str, ctx: ClientContext, record: Record) -> SupervisedPlan | None:
        """Each client's ``train`` task from its own model (the seeded initialization at first)."""
        if task != "train" or type(self).train is not Local.train:
            return None
        start = ctx.state.get("model")
        if start is None:
            start = state_dict_cpu(ctx.build_model())

        def finish(weights: dict[str, torch.Tensor], metrics: dict[str, float]) -> Record:
            ctx.state["model"] = weights
            return Record(metrics=metrics)

        return SupervisedPlan(start=start, finish=finish)

    @client_task("train")
    def train(self, ctx: ClientContext, record: Record) -> Record:
        model = ctx.build_model()
        if "model" in ctx.state:
            model.load_state_dict(ctx.state["model"])
        metrics = train_supervised(model, ctx)
        ctx.state["model"] = state_dict_cpu(model)
        return Record(metrics=metrics)
