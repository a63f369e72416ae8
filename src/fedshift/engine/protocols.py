"""The protocols' scenario builders, by the names of :data:`fedshift.core.runconfig.PROTOCOLS`.

Adding a protocol adds its name and description there and its builder here.
"""

from __future__ import annotations

from collections.abc import Callable

from fedshift.core.runconfig import PROTOCOLS, RunConfig
from fedshift.data.domains import DomainDataset
from fedshift.engine.protocol_lodo import build_lodo
from fedshift.engine.protocol_msst import build_msst
from fedshift.engine.protocol_per_domain import build_per_domain, keep_train_fraction
from fedshift.engine.protocol_personalized import build_personalized
from fedshift.engine.scenario import Scenario, pool_clients

BUILDERS: dict[str, Callable[[RunConfig, DomainDataset], Scenario]] = {
    "lodo": build_lodo,
    "personalized": build_personalized,
    "msst": build_msst,
    "per-domain": build_per_domain,
}
assert BUILDERS.keys() == PROTOCOLS.keys(), "every protocol name needs exactly one builder"


def build_scenario(cfg: RunConfig, dataset: DomainDataset, *, pooled: bool) -> Scenario:
    """Build the federated task of ``cfg.protocol`` (see :data:`BUILDERS`)."""
    builder = BUILDERS[cfg.protocol]
    task = builder(cfg, dataset)
    task.clients = keep_train_fraction(task.clients, cfg.client_data_fraction, cfg.seed)
    if pooled:
        task.clients = [pool_clients(task.clients, "+".join(task.sources))]
    return task
