"""The evaluation protocols: one :class:`Protocol` record per protocol, one module each.

:data:`PROTOCOLS` is the only place a protocol is named: the run config's choice, the
default targets and the command line's help all read it. Adding a protocol is one module
with its ``PROTOCOL`` record plus one line here. A protocol's module (and torch with it) is
imported the first time its record is read: the names alone (the ``protocol`` run key's
help, ``fedshift show ALGO``) import none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedshift.core.errors import ConfigError
from fedshift.core.lazytable import LazyTable
from fedshift.core.runconfig import RunConfig, check_choice, per_domain_value
from fedshift.scenarios.protocol import Protocol

if TYPE_CHECKING:  # the data containers and the scenarios import torch
    from fedshift.data.domains import DomainDataset
    from fedshift.scenarios.scenario import Scenario

__all__ = ["PROTOCOLS", "Protocol", "build_scenario", "get_protocol"]

#: protocol name -> its record (the ``PROTOCOL`` of that module of ``fedshift.scenarios``,
#: imported on first read), in the order the command line lists them
PROTOCOLS: LazyTable = LazyTable(
    __name__,
    {
        "lodo": "lodo:PROTOCOL",
        "personalized": "personalized:PROTOCOL",
        "msst": "msst:PROTOCOL",
        "per-domain": "per_domain:PROTOCOL",
    },
)


def get_protocol(name: str) -> Protocol:
    """The protocol called ``name``; an unknown name is a ConfigError with the choices."""
    check_choice("protocol", name, PROTOCOLS)
    return PROTOCOLS[name]


def build_scenario(cfg: RunConfig, dataset: DomainDataset, *, pooled: bool) -> Scenario:
    """Build the federated task of ``cfg.protocol``, each client keeping
    ``cfg.client_data_fraction`` (its domain's, when given per domain) of its training share
    (``cfg.client_data_of=domain``: that fraction of its domain's train + val images);
    ``pooled`` merges the labeled clients into one (the centralized reference).

    A protocol whose scored domains also train refuses a dataset whose test split is the
    whole domain (a catalog entry loaded without ``held_out_test``): it would score images
    the clients train on."""
    from fedshift.scenarios.per_domain import keep_train_fraction
    from fedshift.scenarios.scenario import pool_clients

    protocol = get_protocol(cfg.protocol)
    if protocol.scores_training_domains and dataset.meta.get("test_is_domain"):
        raise ConfigError(
            f"protocol {protocol.name!r} scores the domains that train, but this copy of "
            f"{dataset.name} tests each domain on all its images, training images included: "
            "load it with load_dataset(..., held_out_test=True) (a run does so itself)"
        )
    task = protocol.build(cfg, dataset)
    fractions = per_domain_value(
        cfg.client_data_fraction, "client_data_fraction", dataset.domain_names, 1.0
    )
    pools = None
    if cfg.client_data_of == "domain":
        pools = {n: len(d.train) + len(d.val) for n, d in dataset.domains.items()}
    task.clients = keep_train_fraction(task.clients, fractions, cfg.seed, pools)
    if pooled:
        task.clients = [pool_clients(task.clients, "+".join(task.sources))]
    return task
