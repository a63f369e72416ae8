"""FedAvg (McMahan et al., 2017)."""

from __future__ import annotations

from fedshift.algorithms.toolkit import (
    averaging_round,
    model_from_record,
    model_record,
    reply_with_model,
    train_segmentation,
    train_supervised,
)
from fedshift.core.algorithm import Algorithm, SupervisedPlan, client_task
from fedshift.core.context import ClientContext
from fedshift.core.federation import Federation
from fedshift.core.hparams import NoHparams
from fedshift.core.record import Kind, Record
from fedshift.core.state import ServerState


class FedAvg(Algorithm):
    """Federated averaging: E local epochs of SGD from the global model, then the
    sample-size-weighted mean of all parameters *and* BatchNorm buffers.

    Client sampling (McMahan's fraction C) is the run option ``fraction``; local epochs E,
    batch size B and learning rate are the run's ``local_epochs``, ``batch_size``, ``lr``.
    """

    name = "fedavg"
    paper = "McMahan et al., Communication-Efficient Learning of Deep Networks, AISTATS 2017"
    Hparams = NoHparams
    shares = {"model": Kind.MODEL}
    private = True
    problems = ("classification", "segmentation")
    batchable = ("train",)

    def round(self, state: ServerState, fed: Federation):
        return averaging_round(
            state, fed, self.run.aggregator, privacy=self.run.privacy, seed=self.run.seed
        )

    def local_penalty(self, ctx: ClientContext, record: Record):
        """Extra term of the local objective; None for plain FedAvg."""
        return None

    def batch_plan(self, task: str, ctx: ClientContext, record: Record) -> SupervisedPlan | None:
        """The ``train`` task of plain supervised FedAvg (a subclass that changes the task
        or the local objective runs sequentially unless it says otherwise)."""
        cls = type(self)
        if (
            task != "train"
            or self.run.problem != "classification"
            or cls.train is not FedAvg.train
            or cls.local_penalty is not FedAvg.local_penalty
        ):
            return None
        return SupervisedPlan(start=record.subset("model"), finish=reply_with_model)

    @client_task("train")
    def train(self, ctx: ClientContext, record: Record) -> Record:
        model = model_from_record(ctx, record)
        trainer = train_segmentation if self.run.problem == "segmentation" else train_supervised
        metrics = trainer(model, ctx, penalty=self.local_penalty(ctx, record))
        reply = model_record(model)
        reply.metrics.update(metrics)
        return reply
