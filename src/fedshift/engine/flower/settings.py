"""Flower run config and node config -> fedshift's RunConfig, data and client identity.

The Flower App's ``[tool.flwr.app.config]`` holds every :class:`RunConfig` key under its
own name (``algorithm``, ``target``, ``local_epochs``, ...), ``algo.<name>`` keys for
hyperparameters, ``set`` (space-separated ``key=value`` items, like the CLI's ``--set``)
and the deployment options in :data:`DEPLOY_DEFAULTS`. ServerApp and ClientApp both read
it, so they build the same federated task.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from fedshift.config import resolve
from fedshift.core.errors import ConfigError
from fedshift.core.runconfig import RUN_KEYS, RunConfig
from fedshift.data.domains import Domain, DomainDataset

#: deployment options in the run config, with their defaults
DEPLOY_DEFAULTS: dict[str, Any] = {
    "out-dir": "",  # run directory on the ServerApp's machine; "" -> runs/<name>
    "resume": False,  # continue the run in out-dir from its checkpoint
    "force-data": False,  # with resume: continue although a domain's data changed
    "round-timeout": 600.0,  # seconds to wait for the replies of one call
    "connect-timeout": 300.0,  # seconds to wait for every client's SuperNode at the start
    "cache-dir": "",  # dataset cache; "" -> $FEDSHIFT_CACHE or ~/.cache/fedshift
    "max-samples": 0,  # > 0: keep the first N samples of each split of each domain
    "set": "",  # extra "key=value key=value" settings (e.g. algo.mu=0.01)
    "client-keys": "",  # TOML file binding each client id to its SuperNode's key (client_keys)
}


@dataclass(frozen=True)
class DeployOptions:
    """The deployment options of a Flower run (see :data:`DEPLOY_DEFAULTS`)."""

    out_dir: str = ""
    resume: bool = False
    force_data: bool = False
    round_timeout: float = 600.0
    connect_timeout: float = 300.0
    cache_dir: str = ""
    max_samples: int = 0
    client_keys: str = ""


def parse_run_config(user_config: Mapping[str, Any]) -> tuple[RunConfig, DeployOptions]:
    """Resolve a Flower run config into a validated RunConfig and the deployment options."""
    flags: dict[str, Any] = {}
    sets: list[str] = []
    for key, value in user_config.items():
        if key in RUN_KEYS:
            flags[key] = value
        elif key.startswith("algo."):
            sets.append(f"{key}={value}")
        elif key not in DEPLOY_DEFAULTS:
            raise ConfigError(
                f"unknown run config key {key!r}; valid: {', '.join(RUN_KEYS)}, algo.<name>, "
                f"{', '.join(DEPLOY_DEFAULTS)}"
            )
    sets.extend(str(user_config.get("set", "")).split())
    cfg = resolve(None, flags, sets)
    opts = {k: user_config.get(k, default) for k, default in DEPLOY_DEFAULTS.items()}
    if float(opts["round-timeout"]) <= 0:
        raise ConfigError(f"round-timeout must be > 0, got {opts['round-timeout']}")
    return cfg, DeployOptions(
        out_dir=str(opts["out-dir"]),
        resume=bool(opts["resume"]),
        force_data=bool(opts["force-data"]),
        round_timeout=float(opts["round-timeout"]),
        connect_timeout=float(opts["connect-timeout"]),
        cache_dir=str(opts["cache-dir"]),
        max_samples=int(opts["max-samples"]),
        client_keys=str(opts["client-keys"]),
    )


def first_samples(dataset: DomainDataset, n: int) -> DomainDataset:
    """The first ``n`` samples of each split of each domain (a small but real task)."""

    def cut(split):
        return split.subset(torch.arange(min(n, len(split))))

    domains = {
        name: Domain(name=name, train=cut(d.train), val=cut(d.val), test=cut(d.test))
        for name, d in dataset.domains.items()
    }
    return DomainDataset(
        name=dataset.name,
        domains=domains,
        classes=dataset.classes,
        channels=dataset.channels,
        image_size=dataset.image_size,
        meta=dict(dataset.meta),
    )


def load_run_dataset(cfg: RunConfig, opts: DeployOptions, cache_dir: str = "") -> DomainDataset:
    """The run's dataset built locally (``cache_dir`` overrides the run's cache dir)."""
    from fedshift.engine.assembly import load_config_dataset  # the engine, only when loading

    dataset = load_config_dataset(cfg, cache_dir or opts.cache_dir or None)
    return first_samples(dataset, opts.max_samples) if opts.max_samples > 0 else dataset


def _node_int(node_config: Mapping[str, Any], key: str) -> int:
    """An integer of the node config; any other type is a :class:`ConfigError`."""
    value = node_config[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"node config {key}={value!r} is not an integer")
    return value


def node_client_id(node_config: Mapping[str, Any], client_ids: list[int]) -> int:
    """The client a SuperNode serves: ``client-id``, else the ``partition-id``-th client.

    ``num-partitions``, when given, must equal the number of clients of the task, so a
    deployment planned for another split fails loudly instead of training the wrong data.
    Every problem (a missing, non-integer or out-of-range id) is a :class:`ConfigError`
    with one line, since the values come from another machine.
    """
    if "client-id" in node_config:
        cid = _node_int(node_config, "client-id")
        if cid not in client_ids:
            raise ConfigError(f"node config client-id={cid} is not a client of this task")
        return cid
    if "partition-id" not in node_config:
        raise ConfigError(
            "the SuperNode needs --node-config 'partition-id=<i> num-partitions=<n>' "
            "or 'client-id=<id>' to know which client it is"
        )
    index = _node_int(node_config, "partition-id")
    total = _node_int(node_config, "num-partitions") if "num-partitions" in node_config else None
    if total is not None and total != len(client_ids):
        raise ConfigError(
            f"node config num-partitions={total} but the task has {len(client_ids)} clients"
        )
    if not 0 <= index < len(client_ids):
        raise ConfigError(f"partition-id={index} outside 0..{len(client_ids) - 1}")
    return client_ids[index]


def node_cache_dir(node_config: Mapping[str, Any]) -> str:
    """The dataset cache a SuperNode uses: node config ``cache-dir``, else $FEDSHIFT_CACHE."""
    return str(node_config.get("cache-dir", "")) or os.environ.get("FEDSHIFT_CACHE", "")
