"""The personalized protocol (FedProto, PerAda, Ditto): each client is scored on its own data.

Label-skew papers measure how well each participant is served: every listed domain trains,
and each client is tested on held-out samples *with the label set of its own training data*
(for FedProto's N-way K-shot split: the test samples of the client's classes). The headline
is the mean ± std over clients. Global-model methods (FedAvg) are scored with the global model
on every client's test share; personal methods (local, FedProto) with each client's own model.
``target_accuracy`` is the mean personalized accuracy, so tables stay uniform, and the run's
``target`` is ``"clients"``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
import torch

from fedshift.core.errors import ConfigError
from fedshift.core.runconfig import RunConfig, listed_domains
from fedshift.core.split import Split
from fedshift.data.domains import DomainDataset
from fedshift.eval.metrics import Predict, accuracy, mean_or_nan, sample_std
from fedshift.scenarios.protocol import Protocol
from fedshift.scenarios.scenario import ClientShard, Scenario, make_clients, partition_sources

#: the ``target`` of the personalized protocol: the clients' own test shares
CLIENTS = "clients"


def personalized_domains(cfg: RunConfig, dataset: DomainDataset) -> list[str]:
    """The domains whose clients train: ``cfg.sources`` when given, else every domain."""
    if cfg.target != CLIENTS:
        raise ConfigError(
            f"protocol 'personalized' scores each client on its own test share: leave --target "
            f"out or pass --target {CLIENTS} (got {cfg.target!r}); restrict the domains with "
            "--sources or a dataset such as digits-dg:mnist"
        )
    if not cfg.sources:
        return list(dataset.domain_names)
    return listed_domains(cfg.sources, dataset.domain_names, dataset.name)


def keep_labels(split: Split, labels: torch.Tensor) -> Split:
    """The samples of ``split`` whose label is in ``labels``."""
    idx = np.flatnonzero(torch.isin(split.y, labels).numpy())
    return split.subset(idx)


def restrict_to_train_labels(client: ClientShard) -> ClientShard:
    """The client with validation and test shares cut to the classes it trains on."""
    labels = torch.unique(client.train.y)
    return dataclasses.replace(
        client, val=keep_labels(client.val, labels), test=keep_labels(client.test, labels)
    )


def build_personalized(cfg: RunConfig, dataset: DomainDataset) -> Scenario:
    """Clients of every listed domain, partitioned by ``cfg.partition`` (``nway-kshot``,
    ``dirichlet`` or ``iid``), each tested on its own test share restricted to its training
    labels. No domain is held out; validation shares drive source-val model selection."""

    domains = personalized_domains(cfg, dataset)
    clients = make_clients(dataset, partition_sources(cfg, dataset, domains))
    clients = [restrict_to_train_labels(c) for c in clients]
    empty = [c.name for c in clients if len(c.test) == 0]
    if empty:
        raise ConfigError(
            f"client {empty[0]} has no test sample of its training classes; use fewer clients "
            "or a larger alpha"
        )
    return Scenario(clients=clients, sources=domains, targets=[], dataset=dataset, per_client=True)


def global_model_on_clients(
    clients: list[ClientShard],
    model: torch.nn.Module,
    device: torch.device,
    predict: Predict,
) -> dict[str, float]:
    """One (global) model scored on every client's own validation and test shares."""
    return clients_accuracy(clients, lambda _: model, device, predict)


def clients_accuracy(
    clients: list[ClientShard],
    model_of: Callable[[int], torch.nn.Module],
    device: torch.device,
    predict: Predict,
) -> dict[str, float]:
    """Mean own-validation accuracy and mean ± std own-test accuracy over clients."""
    val = [accuracy(model_of(c.client_id), c.val, device, predict) for c in clients]
    test = [accuracy(model_of(c.client_id), c.test, device, predict) for c in clients]
    val = [v for v in val if not math.isnan(v)]
    return {
        "source_val_accuracy": mean_or_nan(val),
        "personalized_accuracy": mean_or_nan(test),
        "personalized_accuracy_std": sample_std(test),
    }


PROTOCOL = Protocol(
    name="personalized",
    description="every domain trains; each client is tested on its own classes; target: clients",
    build=build_personalized,
    default_target=CLIENTS,
    scores_training_domains=True,
)
