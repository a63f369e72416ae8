"""Evaluation of a round: target, per-domain and source-validation scores of the global
model, and each client's personal model where the algorithm keeps one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fedshift.core.context import ClientContext
from fedshift.core.split import Split
from fedshift.core.state import ServerState
from fedshift.engine.assembly import Experiment, mask_channels, personal_model
from fedshift.eval.metrics import accuracy, mean_or_nan, sample_std
from fedshift.eval.segmentation import dice, dice_per_channel
from fedshift.scenarios.personalized import global_model_on_clients

#: per-client scores of a personal model: own val/test shares, every domain's test split
ClientScores = dict[str, float]
#: ``(with_domains) -> {client id: scores}`` of the clients whose personal model answered
ScoreClients = Callable[[bool], dict[int, ClientScores]]

DOMAIN_SCORE = "domain."


#: ``eval_batch_size=0`` (auto), from ``benchmarks/speed/eval_batch.py``: on the CPU, images of at
#: least :data:`CPU_LARGE_IMAGE_PX` px are scored :data:`CPU_BATCH_LARGE_IMAGES` at a time (a
#: batch of 1000 at 224 px allocates gigabytes per layer), smaller ones
#: :data:`CPU_BATCH_SMALL_IMAGES` at a time; on a GPU :data:`GPU_BATCH`.
CPU_LARGE_IMAGE_PX = 128
CPU_BATCH_LARGE_IMAGES = 256
CPU_BATCH_SMALL_IMAGES = 1000
GPU_BATCH = 1024


def auto_eval_batch(device: torch.device, image_px: int) -> int:
    """The evaluation batch of ``eval_batch_size=0`` for images of side ``image_px`` on
    ``device``: small on the CPU for large images, large on a GPU."""
    if device.type != "cpu":
        return GPU_BATCH
    return CPU_BATCH_LARGE_IMAGES if image_px >= CPU_LARGE_IMAGE_PX else CPU_BATCH_SMALL_IMAGES


def eval_batch(cfg, device: torch.device, split: Split) -> int:
    """Samples per forward pass when scoring ``split``: ``cfg.eval_batch_size``, or with 0
    (auto) :func:`auto_eval_batch` of the split's image side."""
    if cfg.eval_batch_size > 0:
        return cfg.eval_batch_size
    return auto_eval_batch(device, int(split.x.shape[-1]))


def scorer(exp: Experiment) -> Callable[..., float]:
    """The run's score of a model on a split: accuracy, or Dice for segmentation, in
    batches of :func:`eval_batch` samples."""
    metric = dice if exp.cfg.problem == "segmentation" else accuracy

    def score(model, split: Split, device: torch.device, predict) -> float:
        return metric(model, split, device, predict, batch_size=eval_batch(exp.cfg, device, split))

    return score


def client_scores(exp: Experiment, ctx: ClientContext, with_domains: bool) -> ClientScores | None:
    """Scores of ``ctx``'s personal model (None if it keeps none): ``val`` and ``test`` on
    its own shares and, ``with_domains``, ``domain.<name>`` on every domain's test split.

    Runs where the client state lives: in-process for the simulation engine, on the
    SuperNode for Flower (the engine's evaluate task), so personal models never travel.
    """
    with exp.precision.autocast():
        return _client_scores(exp, ctx, with_domains)


def _client_scores(exp: Experiment, ctx: ClientContext, with_domains: bool) -> ClientScores | None:
    algo, device = exp.algorithm, exp.device
    model = personal_model(algo, ctx)
    if model is None:
        return None
    score = scorer(exp)
    client = next(c for c in exp.scenario.clients if c.client_id == ctx.client_id)
    out = {
        "val": score(model, client.val, device, algo.predict),
        "test": score(model, client.test, device, algo.predict),
    }
    if with_domains:
        for d in exp.dataset.domain_names:
            out[DOMAIN_SCORE + d] = score(model, exp.dataset.domain(d).test, device, algo.predict)
    return out


#: clients beyond which personal models kept beside a global one are scored every
#: :data:`MANY_CLIENTS_PERSONAL_EVERY` rounds unless ``personal_eval_every`` says otherwise
MANY_CLIENTS = 100
MANY_CLIENTS_PERSONAL_EVERY = 10


def personal_eval_every(cfg, num_clients: int) -> int:
    """Every how many rounds kept personal models are scored: ``cfg.personal_eval_every``,
    or with 0 (auto) every round up to :data:`MANY_CLIENTS` clients and every
    :data:`MANY_CLIENTS_PERSONAL_EVERY` rounds beyond (scoring each client's model on its
    own test share costs one forward pass per client)."""
    if cfg.personal_eval_every > 0:
        return cfg.personal_eval_every
    return 1 if num_clients <= MANY_CLIENTS else MANY_CLIENTS_PERSONAL_EVERY


def evaluate(
    exp: Experiment,
    state: ServerState,
    score_clients: ScoreClients,
    *,
    personal: bool = True,
    sources: bool = True,
) -> dict[str, Any]:
    """Target and per-domain test accuracy, and source-validation accuracy.

    Global methods are evaluated with their global model; personal methods (``local``)
    with each client's model, averaged over clients; their ``personalized_accuracy`` is
    each client's model on its own test share. In a per-client scenario (the personalized
    protocol) global models are scored on every client's share too and ``target_accuracy``
    is the mean personalized accuracy. Global methods that also keep personal models (Ditto,
    PerAda) report those as ``personalized_accuracy``. With ``problem = "segmentation"`` every
    "accuracy" is the mean per-image Dice, repeated as ``target_dice`` / ``per_domain_dice``.
    ``score_clients`` scores personal models where they live (the federation's
    :meth:`~fedshift.engine.federation.BaseFederation.score_clients`). With ``personal``
    False, the personal models kept beside a global model are not scored this round
    (``personal_eval_every``); personal methods and per-client scenarios always are. With
    ``sources`` False (``source_eval_every``) a global model is scored on the target domains
    only: no ``source_val_accuracy`` and only the targets in ``per_domain_accuracy``.
    The forward passes run under the run's precision (autocast; fp32: none).
    """
    with exp.precision.autocast():
        return _evaluate(exp, state, score_clients, personal, sources)


def _evaluate(
    exp: Experiment,
    state: ServerState,
    score_clients: ScoreClients,
    personal: bool,
    sources: bool,
) -> dict[str, Any]:
    algo, device = exp.algorithm, exp.device
    domain_names = exp.dataset.domain_names
    score = scorer(exp)  # Dice: segmentation
    channels: dict[str, dict[str, float]] = {}
    if algo.personal:
        scores = [s for _, s in sorted(score_clients(True).items())]
        if not scores:
            return {}
        per_domain = {d: mean_or_nan([s[DOMAIN_SCORE + d] for s in scores]) for d in domain_names}
        own_test = [s["test"] for s in scores]
        out = {
            "source_val_accuracy": mean_or_nan([s["val"] for s in scores]),
            "personalized_accuracy": mean_or_nan(own_test),
            "personalized_accuracy_std": sample_std(own_test),
        }
    else:
        model = algo.global_model(state)
        if model is None:
            return {}
        if exp.scenario.per_client or not exp.scenario.targets:
            sources = True  # every client's domain is scored: no held-out target to keep
        scored = domain_names if sources else scored_targets(exp)
        channels = channel_dice(exp, model, scored)  # several mask channels (fundus) only
        if channels:
            per_domain = {d: sum(c.values()) / len(c) for d, c in channels.items()}
        else:
            per_domain = {
                d: score(model, exp.dataset.domain(d).test, device, algo.predict) for d in scored
            }
        out: dict[str, Any] = {}
        if sources:
            vals = [exp.dataset.domain(d).val for d in exp.scenario.sources]
            correct = sum(score(model, v, device, algo.predict) * len(v) for v in vals)
            out["source_val_accuracy"] = correct / sum(len(v) for v in vals)
    out["target_accuracy"] = mean_or_nan([per_domain[t] for t in exp.scenario.targets])
    out["per_domain_accuracy"] = per_domain
    if exp.scenario.per_client and not algo.personal:
        out.update(global_model_on_clients(exp.scenario.clients, model, device, algo.predict))
    if not algo.personal and algo.keeps_client_models() and (personal or exp.scenario.per_client):
        out.update(kept_personal_accuracy(score_clients))
    if exp.scenario.per_client:
        out["target_accuracy"] = out["personalized_accuracy"]
    if exp.cfg.problem == "segmentation":
        out["target_dice"] = out["target_accuracy"]
        out["per_domain_dice"] = per_domain
        if channels:
            out["per_domain_channel_dice"] = channels
            out["target_channel_dice"] = {
                name: mean_or_nan([channels[t][name] for t in exp.scenario.targets])
                for name in next(iter(channels.values()))
            }
    return out


def scored_targets(exp: Experiment) -> list[str]:
    """The domains scored in a round without source evaluation: the run's targets."""
    return [d for d in exp.dataset.domain_names if d in exp.scenario.targets]


def channel_dice(exp: Experiment, model, domains: list[str]) -> dict[str, dict[str, float]]:
    """Domain -> mask channel -> Dice of ``model`` on the test split of each of ``domains``,
    for a segmentation dataset with several mask channels (fundus: disc, cup); else empty.
    The mean over a domain's channels is its Dice."""
    names = mask_channels(exp.cfg, exp.dataset)
    if len(names) < 2:
        return {}
    algo, device = exp.algorithm, exp.device
    per_domain = {}
    for d in domains:
        test = exp.dataset.domain(d).test
        batch = eval_batch(exp.cfg, device, test)
        scores = dice_per_channel(model, test, device, algo.predict, batch_size=batch)
        per_domain[d] = dict(zip(names, scores, strict=True))
    return per_domain


def kept_personal_accuracy(score_clients: ScoreClients) -> dict[str, float]:
    """Personal models kept next to a global one (Ditto's and PerAda's v_k) scored on each
    client's own test share; empty for algorithms without them."""
    scores = [s["test"] for _, s in sorted(score_clients(False).items())]
    if not scores:
        return {}
    return {
        "personalized_accuracy": mean_or_nan(scores),
        "personalized_accuracy_std": sample_std(scores),
    }


#: how close a domain's accuracy must be to a class's share to count as that share
CHANCE_TOLERANCE = 1e-9


def at_chance(exp: Experiment, per_domain: dict[str, float] | None) -> bool:
    """Whether every accuracy of ``per_domain`` is exactly one class's share of its domain's
    test split: the model predicts one class for every image of each scored domain, a
    chance-level result however far the training loss fell. Classification with a global
    model only (a personal model's domain score is a mean over clients)."""
    if not per_domain or exp.algorithm.personal or exp.cfg.problem != "classification":
        return False
    for domain, score in per_domain.items():
        if not isinstance(score, float) or domain not in exp.dataset.domain_names:
            return False
        labels = exp.dataset.domain(domain).test.y
        if len(labels) == 0:
            return False
        shares = torch.bincount(labels, minlength=exp.dataset.num_classes).double() / len(labels)
        if not bool(((shares - score).abs() <= CHANCE_TOLERANCE).any()):
            return False
    return True
