"""The record that says one protocol: its name, what it evaluates, its default target and
its builder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fedshift.core.runconfig import RunConfig
from fedshift.data.domains import DomainDataset
from fedshift.scenarios.scenario import Scenario


@dataclass(frozen=True)
class Protocol:
    """One evaluation protocol (``RunConfig.protocol``).

    ``default_target`` is the run's ``target`` when the user gives none (``None``: the
    run config's own default, a held-out domain); ``build`` makes the federated task.
    """

    name: str
    description: str
    build: Callable[[RunConfig, DomainDataset], Scenario]
    default_target: str | None = None
