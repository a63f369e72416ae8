"""The record that says one protocol: its name, what it evaluates, its default target and
its builder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the data containers and the scenarios import torch
    from fedshift.core.runconfig import RunConfig
    from fedshift.data.domains import DomainDataset
    from fedshift.scenarios.scenario import Scenario


@dataclass(frozen=True)
class Protocol:
    """One evaluation protocol (``RunConfig.protocol``).

    ``default_target`` is the run's ``target`` when the user gives none (``None``: the
    run config's own default, a held-out domain); ``build`` makes the federated task.
    ``scores_training_domains``: the domains it scores also train with labels, so their test
    images must be held out from training: a dataset whose test split is the whole domain is
    loaded with a held-out test part instead (``load_dataset(held_out_test=True)``).
    """

    name: str
    description: str
    build: Callable[[RunConfig, DomainDataset], Scenario]
    default_target: str | None = None
    scores_training_domains: bool = False
