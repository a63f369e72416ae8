"""A run: config -> task -> rounds -> run directory (config, metrics, summary, checkpoint)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

import fedshift
from fedshift.algorithms import REGISTRY
from fedshift.config import ConfigError, RunConfig, make_hparams
from fedshift.core.algorithm import Algorithm, RunInfo
from fedshift.core.context import ClientContext, TrainConfig
from fedshift.core.context import ClientData as ClientView
from fedshift.core.record import Kind
from fedshift.core.seeding import derive_seed
from fedshift.core.state import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    ServerState,
    atomic_save,
    load_checkpoint,
)
from fedshift.data import load_dataset
from fedshift.data.domains import DatasetError, DomainDataset
from fedshift.engine.protocol_personalized import global_model_on_clients
from fedshift.engine.rundir import claim_run_dir, run_dir_contents
from fedshift.engine.simulation import SimulationFederation
from fedshift.engine.task import FederatedTask, build_task, server_images
from fedshift.eval.metrics import accuracy, select_round
from fedshift.eval.segmentation import check_masks, dice
from fedshift.models import build_model
from fedshift.models.registry import parse_variants, variant_of_client


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "device 'cuda' requested but CUDA is not available; use --device cpu or auto"
        )
    return torch.device(name)


def model_builder(cfg: RunConfig, dataset: DomainDataset, options: dict | None = None):
    """A function returning the same seeded initialization on every call.

    ``options`` are extra model options (a ``hetero_models`` variant)."""
    image_size = cfg.image_size or dataset.image_size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(cfg.seed, "model-init"))
        try:
            template = build_model(
                cfg.model,
                dataset.num_classes,
                in_channels=dataset.channels,
                image_size=image_size,
                weights_path=cfg.model_weights or None,
                **(options or {}),
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def build() -> torch.nn.Module:
        return copy.deepcopy(template)

    return build


def client_model_builders(
    cfg: RunConfig, dataset: DomainDataset, task: FederatedTask, build
) -> dict[int, Any]:
    """Each client's model builder: ``build`` for all, or its ``hetero_models`` variant.

    Variants go to the clients in contiguous blocks (:func:`variant_of_client`). Only
    algorithms that send no model weights can mix architectures.
    """
    try:
        variants = parse_variants(cfg.hetero_models)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not variants:
        return {c.client_id: build for c in task.clients}
    if Kind.MODEL in REGISTRY[cfg.algorithm].shares.values():
        raise ConfigError(
            f"hetero_models needs an algorithm that shares no model weights; "
            f"{cfg.algorithm!r} averages models (try fedproto, bd-fedproto or local)"
        )
    builds = [model_builder(cfg, dataset, options) for options in variants]
    n = len(task.clients)
    return {
        c.client_id: builds[variant_of_client(i, n, len(builds))]
        for i, c in enumerate(task.clients)
    }


@contextlib.contextmanager
def building_with(algo: Algorithm, build):
    """Let ``algo`` build models with ``build`` (a client's architecture) for a while."""
    original = algo.run
    algo.run = dataclasses.replace(original, build_model=build)
    try:
        yield algo
    finally:
        algo.run = original


def personal_model(algo: Algorithm, ctx: ClientContext) -> torch.nn.Module | None:
    """A client's personal model, built with the client's own architecture."""
    with building_with(algo, ctx.build_model):
        return algo.client_model(ctx.state)


@dataclass
class Experiment:
    """Everything built from a config before the first round."""

    cfg: RunConfig
    dataset: DomainDataset
    task: FederatedTask
    algorithm: Algorithm
    contexts: dict[int, ClientContext]
    device: torch.device
    info: dict[str, Any] = field(default_factory=dict)
    #: unlabeled images the server holds (``cfg.server_data``), e.g. PerAda's KD set
    server_data: torch.Tensor | None = None


def prepare(
    cfg: RunConfig, *, cache_dir: str | None = None, dataset: DomainDataset | None = None
) -> Experiment:
    """Load data, partition, build algorithm and client contexts; raises on bad input.

    ``dataset`` skips loading ``cfg.dataset`` (tests pass small in-memory datasets).
    """
    device = resolve_device(cfg.device)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    if dataset is None:
        try:
            dataset = load_dataset(
                cfg.dataset, cache_dir=cache_dir, image_size=cfg.image_size or None
            )
        except DatasetError as exc:
            raise ConfigError(str(exc)) from None
    algo_cls = REGISTRY[cfg.algorithm]
    task = build_task(cfg, dataset, pooled=algo_cls.pooled)
    if cfg.task == "segmentation":
        try:
            check_masks([s for c in task.clients for s in (c.train, c.val, c.test)], "a client")
        except DatasetError as exc:
            raise ConfigError(str(exc)) from None
    server_data = server_images(cfg, dataset, task)
    build = model_builder(cfg, dataset)
    client_builds = client_model_builders(cfg, dataset, task, build)
    train_cfg = TrainConfig(
        lr=cfg.lr,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        batch_size=cfg.batch_size,
        local_epochs=cfg.local_epochs,
        optimizer=cfg.optimizer,
    )
    run = RunInfo(
        num_classes=dataset.num_classes,
        build_model=build,
        train_cfg=train_cfg,
        total_rounds=cfg.rounds,
        seed=cfg.seed,
        device=device,
    )
    algorithm = algo_cls(make_hparams(cfg), run)
    algorithm.task = cfg.task
    validate_task = getattr(algorithm, "validate_task", None)  # e.g. PerAda's backbone domain
    if validate_task is not None:
        validate_task(task)
    contexts = {}
    for client in task.clients:
        labeled = client.role == "source"
        contexts[client.client_id] = ClientContext(
            client_id=client.client_id,
            name=client.name,
            domain=client.domain,
            role=client.role,
            train=ClientView(client.train, labeled, device),
            val=ClientView(client.val, labeled, device),
            test=ClientView(client.test, labeled, device),
            num_classes=dataset.num_classes,
            build_model=client_builds[client.client_id],
            rng=torch.Generator(),
            device=device,
            train_cfg=train_cfg,
            total_rounds=cfg.rounds,
        )
    info = {
        "fedshift_version": fedshift.__version__,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        "sources": task.sources,
        "targets": task.targets,
        "clients": [
            {
                "id": c.client_id,
                "name": c.name,
                "domain": c.domain,
                "role": c.role,
                "train": len(c.train),
                "val": len(c.val),
                "test": len(c.test),
            }
            for c in task.clients
        ],
        "dataset_meta": {"classes": dataset.classes, "image_size": dataset.image_size},
    }
    return Experiment(cfg, dataset, task, algorithm, contexts, device, info, server_data)


#: per-client scores of a personal model: own val/test shares, every domain's test split
ClientScores = dict[str, float]
#: ``(with_domains) -> {client id: scores}`` of the clients whose personal model answered
ScoreClients = Callable[[bool], dict[int, ClientScores]]

DOMAIN_SCORE = "domain."


def client_scores(exp: Experiment, ctx: ClientContext, with_domains: bool) -> ClientScores | None:
    """Scores of ``ctx``'s personal model (None if it keeps none): ``val`` and ``test`` on
    its own shares and, ``with_domains``, ``domain.<name>`` on every domain's test split.

    Runs where the client state lives: in-process for the simulation engine, on the
    SuperNode for Flower (the engine's evaluate task), so personal models never travel.
    """
    algo, device = exp.algorithm, exp.device
    model = personal_model(algo, ctx)
    if model is None:
        return None
    score = dice if exp.cfg.task == "segmentation" else accuracy
    client = next(c for c in exp.task.clients if c.client_id == ctx.client_id)
    out = {
        "val": score(model, client.val, device, algo.predict),
        "test": score(model, client.test, device, algo.predict),
    }
    if with_domains:
        for d in exp.dataset.domain_names:
            out[DOMAIN_SCORE + d] = score(model, exp.dataset.domain(d).test, device, algo.predict)
    return out


def local_client_scores(exp: Experiment) -> ScoreClients:
    """:data:`ScoreClients` computed in this process from the contexts' states."""

    def run(with_domains: bool) -> dict[int, ClientScores]:
        found = {cid: client_scores(exp, ctx, with_domains) for cid, ctx in exp.contexts.items()}
        return {cid: s for cid, s in found.items() if s is not None}

    return run


def evaluate(
    exp: Experiment, state: ServerState, score_clients: ScoreClients | None = None
) -> dict[str, Any]:
    """Target and per-domain test accuracy, and source-validation accuracy.

    Global methods are evaluated with their global model; personal methods (``local``)
    with each client's model, averaged over clients; their ``personalized_accuracy`` is
    each client's model on its own test share. In a per-client task (the personalized
    protocol) global models are scored on every client's share too and ``target_accuracy``
    is the mean personalized accuracy. Global methods that also keep personal models (Ditto,
    PerAda) report those as ``personalized_accuracy``. With ``task = "segmentation"`` every
    "accuracy" is the mean per-image Dice, repeated as ``target_dice`` / ``per_domain_dice``.
    ``score_clients`` scores personal models where they live (default: in this process).
    """
    algo, device = exp.algorithm, exp.device
    domain_names = exp.dataset.domain_names
    score = dice if exp.cfg.task == "segmentation" else accuracy  # Dice: segmentation
    score_clients = score_clients or local_client_scores(exp)
    if algo.personal:
        scores = [s for _, s in sorted(score_clients(True).items())]
        if not scores:
            return {}
        per_domain = {d: _mean([s[DOMAIN_SCORE + d] for s in scores]) for d in domain_names}
        own_test = [s["test"] for s in scores]
        out = {
            "source_val_accuracy": _mean([s["val"] for s in scores]),
            "personalized_accuracy": _mean(own_test),
            "personalized_accuracy_std": _std(own_test),
        }
    else:
        model = algo.global_model(state)
        if model is None:
            return {}
        per_domain = {
            d: score(model, exp.dataset.domain(d).test, device, algo.predict) for d in domain_names
        }
        sizes = [len(exp.dataset.domain(d).val) for d in exp.task.sources]
        accs = [
            score(model, exp.dataset.domain(d).val, device, algo.predict) for d in exp.task.sources
        ]
        out = {
            "source_val_accuracy": sum(a * n for a, n in zip(accs, sizes, strict=True)) / sum(sizes)
        }
    out["target_accuracy"] = _mean([per_domain[t] for t in exp.task.targets])
    out["per_domain_accuracy"] = per_domain
    if exp.task.per_client and not algo.personal:
        out.update(global_model_on_clients(exp.task.clients, model, device, algo.predict))
    if not algo.personal and algo.keeps_client_models():
        out.update(kept_personal_accuracy(score_clients))
    if exp.task.per_client:
        out["target_accuracy"] = out["personalized_accuracy"]
    if exp.cfg.task == "segmentation":
        out["target_dice"] = out["target_accuracy"]
        out["per_domain_dice"] = per_domain
    return out


def kept_personal_accuracy(score_clients: ScoreClients) -> dict[str, float]:
    """Personal models kept next to a global one (Ditto's and PerAda's v_k) scored on each
    client's own test share; empty for algorithms without them."""
    scores = [s["test"] for _, s in sorted(score_clients(False).items())]
    if not scores:
        return {}
    return {"personalized_accuracy": _mean(scores), "personalized_accuracy_std": _std(scores)}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _std(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    m = _mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def default_run_name(cfg: RunConfig) -> str:
    return f"{cfg.algorithm}-{Path(cfg.dataset).name}-{cfg.target}-s{cfg.seed}"


def unique_dir(base: Path) -> Path:
    if not base.exists():
        return base
    for i in range(2, 10_000):
        candidate = base.with_name(f"{base.name}-{i}")
        if not candidate.exists():
            return candidate
    raise ConfigError(f"too many runs named {base}")


COMPARE_IGNORE = ("device", "threads")


def check_resume_config(saved: dict[str, Any], cfg: RunConfig) -> None:
    now = cfg.to_dict()
    diffs = [k for k in now if k not in COMPARE_IGNORE and saved.get(k) != now[k]]
    if diffs:
        k = diffs[0]
        raise CheckpointError(
            f"cannot resume: config differs from the checkpoint ({k}: saved {saved.get(k)!r}, "
            f"now {now[k]!r}); resume with the same settings or start a new run"
        )


def federation_options(exp: Experiment) -> dict[str, Any]:
    """The run config's settings of a :class:`SimulationFederation` (and its subclasses)."""
    cfg = exp.cfg
    return {
        "seed": cfg.seed,
        "fraction": cfg.fraction,
        "failure_policy": cfg.failure_policy,
        "min_clients": cfg.min_clients,
        "count_bytes": not exp.algorithm.pooled,
        "total_rounds": cfg.rounds,
    }


class Runner:
    """Drives one experiment through its rounds with checkpoints after each round."""

    def __init__(
        self,
        exp: Experiment,
        out_dir: Path,
        *,
        progress: bool = True,
        fed: SimulationFederation | None = None,
    ):
        """``fed`` is the engine's federation (e.g. Flower's); default: in-process."""
        self.exp = exp
        self.out = out_dir
        self.progress = progress
        if fed is None:
            fed = SimulationFederation(exp.algorithm, exp.contexts, **federation_options(exp))
        self.fed = fed
        self.fed.server_data = exp.server_data
        #: scores personal models where client states live (Flower: on the SuperNodes)
        self.score_clients = getattr(fed, "score_clients", None) or local_client_scores(exp)

    @property
    def checkpoint_path(self) -> Path:
        return self.out / "checkpoint.pt"

    def _save(self, round_: int, state: ServerState, history: list[dict], wall: float) -> None:
        atomic_save(
            {
                "format": CHECKPOINT_FORMAT,
                "round": round_,
                "config": self.exp.cfg.to_dict(),
                "server": state.to_dict(),
                "clients": {str(cid): ctx.state for cid, ctx in self.exp.contexts.items()},
                "counters": {
                    "bytes_up": self.fed.bytes_up,
                    "bytes_down": self.fed.bytes_down,
                    "samples": self.fed.samples,
                    "wall_seconds": wall,
                },
                "history": history,
            },
            self.checkpoint_path,
        )

    def _restore(self) -> tuple[int, ServerState, list[dict], float]:
        data = load_checkpoint(self.checkpoint_path)
        check_resume_config(data["config"], self.exp.cfg)
        for cid, ctx in self.exp.contexts.items():
            ctx.state = dict(data["clients"].get(str(cid), {}))
        counters = data["counters"]
        self.fed.bytes_up = counters["bytes_up"]
        self.fed.bytes_down = counters["bytes_down"]
        self.fed.samples = counters["samples"]
        return (
            data["round"],
            ServerState.from_dict(data["server"]),
            list(data["history"]),
            counters["wall_seconds"],
        )

    def run(self, *, resume: bool = False, stop_after: int | None = None) -> dict[str, Any]:
        """Run (or continue) all rounds; ``stop_after`` ends early (to test resuming)."""
        cfg, algo, fed = self.exp.cfg, self.exp.algorithm, self.fed
        self.out.mkdir(parents=True, exist_ok=True)
        if resume:
            start, state, history, wall = self._restore()
        else:
            (self.out / "config.json").write_text(
                json.dumps({**cfg.to_dict(), "run_info": self.exp.info}, indent=2) + "\n"
            )
            start, history, wall = 0, [], 0.0
            fed.begin_round(0)
            state = algo.init_state()
            state = algo.setup(state, fed)
        self._write_metrics(history)
        bar = tqdm(
            total=cfg.rounds,
            initial=start,
            desc=f"{cfg.algorithm} -> {cfg.target}",
            unit="round",
            disable=not self.progress,
            file=sys.stderr,
            dynamic_ncols=True,
        )
        for round_ in range(start + 1, cfg.rounds + 1):
            t0 = time.perf_counter()
            fed.begin_round(round_)
            state, train_metrics = algo.round(state, fed)
            entry: dict[str, Any] = {"round": round_}
            entry.update({k: float(v) for k, v in train_metrics.items()})
            if round_ % cfg.eval_every == 0 or round_ == cfg.rounds:
                entry.update(evaluate(self.exp, state, self.score_clients))
            entry["bytes_up"] = fed.bytes_up
            entry["bytes_down"] = fed.bytes_down
            entry["failed_clients"] = len(fed.failures)
            wall += time.perf_counter() - t0
            entry["seconds"] = round(time.perf_counter() - t0, 3)
            history.append(entry)
            self._save(round_, state, history, wall)
            self._append_metrics(entry)
            bar.update(1)
            bar.set_postfix(
                loss=f"{entry.get('train_loss', float('nan')):.3f}",
                target=f"{entry.get('target_accuracy', float('nan')):.3f}",
            )
            if stop_after is not None and round_ >= stop_after and round_ < cfg.rounds:
                bar.close()
                return {}
        bar.close()
        summary = self.summarize(history, wall)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return summary

    def _write_metrics(self, history: list[dict]) -> None:
        with open(self.out / "metrics.jsonl", "w") as handle:
            for entry in history:
                handle.write(json.dumps(entry) + "\n")

    def _append_metrics(self, entry: dict) -> None:
        with open(self.out / "metrics.jsonl", "a") as handle:
            handle.write(json.dumps(entry) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def summarize(self, history: list[dict], wall: float) -> dict[str, Any]:
        cfg = self.exp.cfg
        chosen = select_round(history, "source-val")
        last = select_round(history, "last")
        oracle = select_round(history, "oracle")
        summary = {
            "algorithm": cfg.algorithm,
            "dataset": cfg.dataset,
            "protocol": cfg.protocol,
            "target": cfg.target,
            "seed": cfg.seed,
            "rounds": cfg.rounds,
            "model_selection": "source-val",
            "target_accuracy": chosen["target_accuracy"],
            "selected_round": chosen["round"],
            "target_accuracy_last": last["target_accuracy"],
            "target_accuracy_oracle": oracle["target_accuracy"],
            "oracle_round": oracle["round"],
            "source_val_accuracy": chosen["source_val_accuracy"],
            "per_domain_accuracy": chosen["per_domain_accuracy"],
            "per_domain_accuracy_last": last["per_domain_accuracy"],
            "bytes_up": self.fed.bytes_up,
            "bytes_down": self.fed.bytes_down,
            "bytes_per_round": (self.fed.bytes_up + self.fed.bytes_down) / max(cfg.rounds, 1),
            "failed_clients": sum(h.get("failed_clients", 0) for h in history),
            "wall_seconds": round(wall, 3),
            "samples_per_second": round(self.fed.samples / wall, 1) if wall > 0 else 0.0,
            "device": str(self.exp.device),
        }
        if "personalized_accuracy" in last:
            summary["personalized_accuracy"] = last["personalized_accuracy"]
            summary["personalized_accuracy_std"] = last["personalized_accuracy_std"]
        if cfg.task == "segmentation":  # the "accuracy" figures are Dice scores
            summary["task"] = cfg.task
            summary["target_dice"] = chosen["target_accuracy"]
            summary["target_dice_last"] = last["target_accuracy"]
            summary["per_domain_dice"] = chosen["per_domain_accuracy"]
        algo = self.exp.algorithm
        picked = select_by_score(history, algo.selection_lower_is_better)
        if algo.selection and picked is not None:
            summary[f"target_accuracy_{algo.selection}"] = picked["target_accuracy"]
            summary[f"{algo.selection}_round"] = picked["round"]
        return summary


def select_by_score(history: list[dict], lower_is_better: bool = True) -> dict | None:
    """The evaluated round with the best ``selection_score`` (first on ties), or None.

    The score is a label-free round metric an algorithm reports (FACT's inter-domain
    distance on the target client), so selecting by it uses no target labels.
    """
    scored = [
        h
        for h in history
        if "target_accuracy" in h
        and math.isfinite(h.get("selection_score", math.nan))
        and not math.isnan(h["target_accuracy"])
    ]
    if not scored:
        return None
    sign = 1.0 if lower_is_better else -1.0
    return min(scored, key=lambda h: sign * h["selection_score"])


def run_experiment(
    cfg: RunConfig,
    out: str | Path | None = None,
    *,
    resume: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
    cache_dir: str | None = None,
    dataset: DomainDataset | None = None,
    federation: Callable[[Experiment], SimulationFederation] | None = None,
) -> tuple[dict[str, Any], Path]:
    """Build and run; returns the summary (empty if stopped early) and the run directory.

    ``federation`` builds the engine's federation from the experiment (the Flower
    ServerApp passes one); default: the in-process simulation engine.
    """
    if resume and out is None:
        raise ConfigError("--resume needs --out RUN_DIR (the run to continue)")
    exp = prepare(cfg, cache_dir=cache_dir, dataset=dataset)
    if out is None:
        out_dir = unique_dir(Path("runs") / default_run_name(cfg))
    else:
        out_dir = Path(out)
        if resume and not (out_dir / "checkpoint.pt").exists():
            raise CheckpointError(f"cannot resume: no checkpoint.pt in {out_dir}")
    with claim_run_dir(out_dir):
        if not resume and run_dir_contents(out_dir):
            raise ConfigError(
                f"run directory {out_dir} is not empty; "
                "use --resume to continue it or another --out"
            )
        fed = federation(exp) if federation is not None else None
        runner = Runner(exp, out_dir, progress=progress, fed=fed)
        return runner.run(resume=resume, stop_after=stop_after), out_dir
