"""Evaluation of a round: target, per-domain and source-validation scores of the global
model, and each client's personal model where the algorithm keeps one."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from fedshift.core.context import ClientContext
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


def scorer(exp: Experiment) -> Callable[..., float]:
    """The run's score of a model on a split: accuracy, or Dice for segmentation, in
    batches of ``eval_batch_size`` samples (0: the metric's own default)."""
    score = dice if exp.cfg.problem == "segmentation" else accuracy
    if exp.cfg.eval_batch_size > 0:
        return functools.partial(score, batch_size=exp.cfg.eval_batch_size)
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
    exp: Experiment, state: ServerState, score_clients: ScoreClients, *, personal: bool = True
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
    (``personal_eval_every``); personal methods and per-client scenarios always are.
    The forward passes run under the run's precision (autocast; fp32: none).
    """
    with exp.precision.autocast():
        return _evaluate(exp, state, score_clients, personal)


def _evaluate(
    exp: Experiment, state: ServerState, score_clients: ScoreClients, personal: bool
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
        channels = channel_dice(exp, model)  # several mask channels (fundus) only
        if channels:
            per_domain = {d: sum(c.values()) / len(c) for d, c in channels.items()}
        else:
            per_domain = {
                d: score(model, exp.dataset.domain(d).test, device, algo.predict)
                for d in domain_names
            }
        sizes = [len(exp.dataset.domain(d).val) for d in exp.scenario.sources]
        accs = [
            score(model, exp.dataset.domain(d).val, device, algo.predict)
            for d in exp.scenario.sources
        ]
        out = {
            "source_val_accuracy": sum(a * n for a, n in zip(accs, sizes, strict=True)) / sum(sizes)
        }
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
                for name in channels[domain_names[0]]
            }
    return out


def channel_dice(exp: Experiment, model) -> dict[str, dict[str, float]]:
    """Domain -> mask channel -> Dice of ``model`` on the domain's test split, for a
    segmentation dataset with several mask channels (fundus: disc, cup); else empty. The
    mean over a domain's channels is its Dice."""
    names = mask_channels(exp.cfg, exp.dataset)
    if len(names) < 2:
        return {}
    algo, device = exp.algorithm, exp.device
    batch = {"batch_size": exp.cfg.eval_batch_size} if exp.cfg.eval_batch_size > 0 else {}
    per_domain = {}
    for d in exp.dataset.domain_names:
        scores = dice_per_channel(model, exp.dataset.domain(d).test, device, algo.predict, **batch)
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
