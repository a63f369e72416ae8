"""Seeded random search over hyperparameters (``fedshift sweep --random N``), as DomainBed's
``hparams_registry.random_hparams``: trial 0 holds the defaults, trials 1..N-1 draw each
searched key from its declared distribution, from a stream named by (search seed, algorithm,
trial), so the same command plans the same points on every machine and on every resume."""

from __future__ import annotations

import random
from typing import Any

from fedshift.algorithms import REGISTRY
from fedshift.core.hparams import Search, search_spaces
from fedshift.core.runconfig import RunConfig


def searched_keys(algorithm: str, fixed: set[str]) -> dict[str, Search]:
    """The keys a random search of ``algorithm`` draws (``algo.NAME`` for its hyperparameters'
    ``search`` declarations, plus the run keys declaring one: lr and weight_decay, DomainBed's
    choice of the common knobs), less those the user fixed."""
    spaces = {f"algo.{k}": s for k, s in search_spaces(REGISTRY[algorithm].Hparams).items()}
    spaces |= search_spaces(RunConfig)
    return {key: spaces[key] for key in sorted(spaces) if key not in fixed}


def random_points(algorithm: str, trials: int, seed: int, fixed: set[str]) -> list[dict[str, Any]]:
    """``trials`` settings for ``algorithm``: ``{}`` (its defaults) first, then one draw of
    every searched key per trial."""
    spaces = searched_keys(algorithm, fixed)
    points: list[dict[str, Any]] = [{}]
    for trial in range(1, trials):
        rng = random.Random(f"fedshift-random-search:{seed}:{algorithm}:{trial}")
        points.append({key: space.draw(rng) for key, space in spaces.items()})
    return points
