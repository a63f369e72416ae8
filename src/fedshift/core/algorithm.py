"""Algorithm base class, client-task registration and the algorithm registry type."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from fedshift.core.context import ClientContext, TrainConfig
from fedshift.core.federation import Federation
from fedshift.core.hparams import BaseHparams, NoHparams
from fedshift.core.privacy import PrivacySettings
from fedshift.core.record import Kind, Record, share_key
from fedshift.core.robust import Aggregator
from fedshift.core.schema import ReplySchema, echo
from fedshift.core.state import ServerState

TaskFn = Callable[[Any, ClientContext, Record], Record]


def client_task(name: str) -> Callable[[TaskFn], TaskFn]:
    """Mark a method ``task(self, ctx, record) -> Record`` as the client task ``name``."""

    def mark(fn: TaskFn) -> TaskFn:
        fn.__client_task__ = name  # type: ignore[attr-defined]
        return fn

    return mark


def local_metrics(ctx: ClientContext, seen: int, **sums: float) -> dict[str, float]:
    """A client reply's metrics: each of ``sums`` (a per-sample-weighted sum) as its mean over
    the ``seen`` samples, the split size ``num-examples`` (the aggregation weight) and
    ``samples`` (what was processed, for throughput)."""
    means = {key: value / max(seen, 1) for key, value in sums.items()}
    return {**means, "num-examples": len(ctx.train), "samples": seen}


@dataclasses.dataclass
class SupervisedPlan:
    """One client's share of a vectorized ``train`` call (see
    :mod:`fedshift.engine.simulation.vectorized`): cross-entropy SGD for ``epochs`` epochs on the
    client's labeled training split, exactly as :func:`train_supervised` does it, from the
    weights ``start`` (a full state dict), with ``mu``/2·‖w − ``start``‖² added over the
    trainable parameters when ``mu`` > 0 (FedProx). ``finish(weights, metrics)`` turns the
    trained state dict and the reply metrics of :func:`local_metrics` into the reply.
    """

    start: dict[str, torch.Tensor]
    finish: Callable[[dict[str, torch.Tensor], dict[str, float]], Record]
    mu: float = 0.0
    epochs: int | None = None


@dataclasses.dataclass
class RunInfo:
    """What an algorithm knows about the run it is part of (never client data)."""

    num_classes: int
    build_model: Callable[[], torch.nn.Module]
    train_cfg: TrainConfig
    total_rounds: int
    seed: int
    device: torch.device
    #: the learning problem of the run (``RunConfig.problem``)
    problem: str = "classification"
    #: how the server program combines what clients send (``aggregator`` run keys); call
    #: it where a mean would go: ``self.run.aggregator(items, weights)``
    aggregator: Aggregator = dataclasses.field(default_factory=Aggregator)
    #: client-level differential privacy of the run, None when off
    privacy: PrivacySettings | None = None


class Algorithm:
    """Base of every algorithm: a server program over :class:`Federation` plus client tasks.

    Subclasses set ``name``, ``paper``, ``Hparams`` (frozen dataclass, paper defaults) and
    ``shares`` (every array a client may send, by top-level key, with its :class:`Kind`),
    implement :meth:`round` and register client tasks with :func:`client_task`.
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    Hparams: ClassVar[type[BaseHparams]] = NoHparams
    shares: ClassVar[dict[str, Kind]] = {}
    #: train on all source data pooled into one client (the non-federated reference)
    pooled: ClassVar[bool] = False
    #: evaluate each client's own model instead of one global model
    personal: ClassVar[bool] = False
    #: every share is covered by differential privacy when ``RunInfo.privacy`` is set (the
    #: algorithm aggregates its models with ``private_model_mean`` and its prototypes with
    #: the clipped, noisy per-class mean); ``config.validate`` refuses dp for the others
    private: ClassVar[bool] = False
    #: protocols the algorithm can run in; empty: any. The contract test runs the first
    #: (``lodo`` when empty) and ``config.validate`` rejects the others.
    protocols: ClassVar[tuple[str, ...]] = ()
    #: name of a label-free model-selection rule fed by the round metric ``selection_score``
    #: (e.g. ``min_idd``); the summary then reports ``target_accuracy_<name>``
    selection: ClassVar[str] = ""
    #: whether the round with the lowest (True) or highest ``selection_score`` is selected
    selection_lower_is_better: ClassVar[bool] = True
    #: learning problems the client tasks handle; a subclass inherits them only while it
    #: keeps the declaring class's client tasks (see :meth:`supported_problems`)
    problems: ClassVar[tuple[str, ...]] = ("classification",)
    #: the run must name a pretrained backbone file (PerAda's frozen u)
    needs_pretrained_backbone: ClassVar[bool] = False
    #: the model a run of this algorithm uses unless it names one (e.g. FACT's own split)
    default_model: ClassVar[str] = ""
    #: client tasks whose calls may run many clients at once (``vectorize``); the class
    #: describes one client's share with :meth:`batch_plan`
    batchable: ClassVar[tuple[str, ...]] = ()
    _tasks: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        tasks: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            for attr, value in vars(klass).items():
                task = getattr(value, "__client_task__", None)
                if task is not None:
                    tasks[task] = attr
        cls._tasks = tasks

    def __init__(self, hp: Any, run: RunInfo):
        self.hp = hp
        self.run = run

    @classmethod
    def supported_problems(cls) -> tuple[str, ...]:
        """The learning problems of the nearest class declaring ``problems``, as long as
        this class keeps that class's client tasks; otherwise classification only."""
        owner = next(k for k in cls.__mro__ if "problems" in vars(k))
        same = all(getattr(cls, attr) is getattr(owner, attr, None) for attr in cls._tasks.values())
        return tuple(owner.problems) if same else ("classification",)

    def check_scenario(self, scenario: Any) -> None:
        """Raise ConfigError when the built scenario cannot run this algorithm (e.g. PerAda's
        backbone domain held by a client). Default: any scenario."""

    # -- server side -------------------------------------------------------------------
    def build_net(self) -> torch.nn.Module:
        """The network whose weights the server state's ``model`` holds: the run's model;
        algorithms that wrap it (MOON's projection head, FedSR's posterior) override this."""
        return self.run.build_model()

    def init_state(self) -> ServerState:
        """Initial server state: by default a freshly built global model."""
        model = self.build_net()
        return ServerState(model={k: v.detach().clone() for k, v in model.state_dict().items()})

    def setup(self, state: ServerState, fed: Federation) -> ServerState:
        """One-off exchange before round 1 (style banks, amplitude banks). Default: none."""
        return state

    def round(self, state: ServerState, fed: Federation) -> tuple[ServerState, dict[str, float]]:
        raise NotImplementedError

    # -- evaluation ----------------------------------------------------------------------
    def global_model(self, state: ServerState) -> torch.nn.Module | None:
        """The model evaluated on held-out domains (None for purely personal methods)."""
        if not state.model:
            return None
        model = self.build_net()
        model.load_state_dict(state.model)
        return model

    def client_model(self, client_state: dict[str, Any]) -> torch.nn.Module | None:
        """A client's personal model from its state (personal methods only)."""
        return None

    @classmethod
    def keeps_client_models(cls) -> bool:
        """Whether clients keep personal models (the class implements ``client_model``)."""
        return cls.client_model is not Algorithm.client_model

    def predict(self, model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        """Class scores for normalized inputs ``x``; default: the model's logits."""
        return model(x)

    # -- client side -------------------------------------------------------------------
    @classmethod
    def task_names(cls) -> list[str]:
        return sorted(cls._tasks)

    def batch_plan(self, task: str, ctx: ClientContext, record: Record) -> Any:
        """One client's share of a vectorized call of a ``batchable`` task (a plan the
        engine's vectorized executor knows, e.g. ``SupervisedPlan``), or None to run this
        call sequentially."""
        return None

    def reply_schema(self, task: str, sent: Record) -> ReplySchema:
        """The arrays an honest reply to ``task`` holds, given what was ``sent``.

        Default: every sent array of a ``MODEL`` share comes back with the same key, shape
        and dtype, and nothing else. Tasks that reply other arrays (prototypes, statistics,
        part of a model) override this; the federation refuses a reply that does not
        follow it (a failed client), so the server program never sees one.
        """
        models = {share_key(k) for k in sent.arrays if self.shares.get(share_key(k)) == Kind.MODEL}
        return echo(sent, *models)

    def run_task(self, name: str, ctx: ClientContext, record: Record) -> Record:
        attr = self._tasks.get(name)
        if attr is None:
            raise KeyError(
                f"algorithm {self.name!r} has no client task {name!r}; "
                f"tasks: {', '.join(self.task_names())}"
            )
        return getattr(self, attr)(ctx, record)
