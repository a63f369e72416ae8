"""Multi-source single-target (msst): labeled source clients plus one unlabeled target client.

The unsupervised federated domain adaptation setting of FADA and FACT: every source domain is
one labeled client (or ``clients_per_domain`` of them); the target domain is a single client
with role ``target`` that trains on its training split *without labels*; the headline accuracy
is measured on the target's test split, which no client holds.

Label safety does not rest on access checks alone: the target client receives splits whose
labels have been replaced by :data:`NO_LABEL` (and whose masks are dropped), so no code path
(``SplitView``'s private split included) can reach the real target labels.
"""

from __future__ import annotations

import numpy as np
import torch

from fedshift.core.runconfig import RunConfig
from fedshift.core.split import Split
from fedshift.data.domains import DomainDataset
from fedshift.data.partition import partition_domains
from fedshift.scenarios.protocol import Protocol
from fedshift.scenarios.scenario import (
    ClientShard,
    Scenario,
    check_target,
    make_clients,
    partition_sources,
)

#: the label every sample of an unlabeled (target) client carries instead of its real one
NO_LABEL = -1


def strip_labels(split: Split) -> Split:
    """The same images with every label replaced by :data:`NO_LABEL` and no masks."""
    return Split(x=split.x, y=torch.full_like(split.y, NO_LABEL), mask=None)


def build_msst(cfg: RunConfig, dataset: DomainDataset):
    """Sources as in leave-one-domain-out, plus the target domain as one unlabeled client.

    The target client's train, validation and test splits carry no labels; evaluation reads
    the target's test split from the dataset, never from a client.
    """

    sources = check_target(cfg, dataset)
    clients = make_clients(dataset, partition_sources(cfg, dataset, sources))
    target_specs = partition_domains(
        dataset, [cfg.target], role="target", first_id=len(clients), seed=cfg.seed
    )
    for spec in target_specs:
        domain = dataset.domain(spec.domain)
        clients.append(
            ClientShard(
                client_id=spec.client_id,
                name=f"{spec.domain}-target",
                domain=spec.domain,
                role="target",
                train=strip_labels(domain.train.subset(np.asarray(spec.train_idx))),
                val=strip_labels(domain.val.subset(np.asarray(spec.val_idx))),
                test=strip_labels(domain.test.subset(np.asarray(spec.test_idx))),
            )
        )
    return Scenario(clients=clients, sources=sources, targets=[cfg.target], dataset=dataset)


PROTOCOL = Protocol(
    name="msst",
    description="multi-source single-target: sources labeled, target client unlabeled",
    build=build_msst,
)
