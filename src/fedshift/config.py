"""Run configuration: defaults < TOML file < command-line flags < ``--set key=value``."""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PARTITIONS = ("iid", "dirichlet", "nway-kshot")
DEVICES = ("auto", "cpu", "cuda")
TASKS = ("classification", "segmentation")
#: protocols that test every domain; their target defaults to "all"
ALL_DOMAIN_PROTOCOLS = ("per-domain",)


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the valid choices."""


@dataclass
class RunConfig:
    """Everything that defines a run (the algorithm's own hyperparameters live in ``algo``)."""

    algorithm: str = "fedavg"
    dataset: str = "digits-dg"
    target: str = "mnistm"  # held-out domain (leave-one-domain-out)
    sources: str = ""  # comma-separated source domains; empty: every domain but the target
    protocol: str = "lodo"
    task: str = "classification"  # or "segmentation": per-pixel masks, Dice (model unet)
    rounds: int = 30
    local_epochs: int = 1
    batch_size: int = 64
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 5e-4
    optimizer: str = "sgd"
    model: str = "cnn"
    model_weights: str = ""  # local state-dict file for the backbone (never downloaded)
    server_data: str = ""  # "domain" or "domain:split" the server holds unlabeled (PerAda)
    image_size: int = 0  # 0: the dataset's native size
    clients_per_domain: int = 1
    partition: str = "iid"  # how a domain is split among its clients
    dirichlet_alpha: float = 0.5
    ways: int = 3  # partition=nway-kshot: mean classes per client (FedProto's N)
    shots: int = 100  # partition=nway-kshot: train samples per class (FedProto's K)
    stdev: int = 2  # partition=nway-kshot: spread of ways and shots around their means
    # per-client model variants, e.g. "fedproto" or "out_channels=10/18;out_channels=10/20":
    # ';' separates variants, ',' options, '/' tuple items; clients get variants in blocks
    hetero_models: str = ""
    fraction: float = 1.0  # share of source clients sampled each round (McMahan's C)
    client_data_fraction: float = 1.0  # share of its train split each client keeps (FPL)
    seed: int = 0
    device: str = "auto"
    threads: int = 0  # CPU threads for torch; 0 keeps torch's default
    failure_policy: str = "dynamic"
    min_clients: int = 1
    eval_every: int = 1
    algo: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


RUN_KEYS = [f.name for f in dataclasses.fields(RunConfig) if f.name != "algo"]


def _field_type(cls: type, name: str) -> type:
    hints = typing.get_type_hints(cls)
    hint = hints[name]
    if isinstance(hint, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        hint = args[0]
    return hint


def listed_domains(text: str, names: list[str], dataset: str, noun: str = "domain") -> list[str]:
    """Parse a comma-separated domain list (``--sources``) against the dataset's domains."""
    domains = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [d for d in domains if d not in names]
    if unknown:
        raise ConfigError(
            f"unknown {noun} {unknown[0]!r} for {dataset}; choose from: {', '.join(names)}"
        )
    if len(set(domains)) != len(domains):
        raise ConfigError(f"domains repeat in sources: {text}")
    return domains


def coerce(value: Any, kind: type, key: str) -> Any:
    """Convert a TOML or command-line value to the field's type, or raise ConfigError."""
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if kind is float:
            return float(value)
        if kind is str:
            return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key} expects {kind.__name__}, got {value!r}") from None
    return value


def _hparam_types(hparams_cls: type) -> dict[str, type]:
    return {f.name: _field_type(hparams_cls, f.name) for f in dataclasses.fields(hparams_cls)}


def apply_settings(cfg: RunConfig, settings: dict[str, Any], hparams_cls: type | None) -> None:
    """Apply flat ``key -> value`` settings (``algo.x`` for algorithm hyperparameters)."""
    for key, value in settings.items():
        if key.startswith("algo."):
            name = key[5:]
            if hparams_cls is None:
                cfg.algo[name] = value
                continue
            types_ = _hparam_types(hparams_cls)
            if name not in types_:
                valid = ", ".join(f"algo.{n}" for n in types_) or "(none)"
                raise ConfigError(
                    f"unknown hyperparameter {key!r} for algorithm {cfg.algorithm!r}; "
                    f"valid: {valid}"
                )
            cfg.algo[name] = coerce(value, types_[name], key)
        elif key in RUN_KEYS:
            setattr(cfg, key, coerce(value, _field_type(RunConfig, key), key))
        else:
            raise ConfigError(
                f"unknown config key {key!r}; valid: {', '.join(RUN_KEYS)}, algo.<hyperparameter>"
            )


def read_toml(path: str | Path) -> dict[str, Any]:
    """Flatten a TOML config (top-level run keys and an ``[algo]`` table)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key == "algo":
            if not isinstance(value, dict):
                raise ConfigError("[algo] in the config file must be a table")
            flat.update({f"algo.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def parse_set(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def validate(cfg: RunConfig) -> None:
    """Checks that need no data: choices and ranges."""
    from fedshift.algorithms import REGISTRY

    if cfg.algorithm not in REGISTRY:
        raise ConfigError(
            f"unknown algorithm {cfg.algorithm!r}; choose one of: {', '.join(REGISTRY)}"
        )
    from fedshift.engine.task import PROTOCOLS

    if cfg.protocol not in PROTOCOLS:
        raise ConfigError(
            f"unknown protocol {cfg.protocol!r}; choose one of: {', '.join(PROTOCOLS)}"
        )
    supported = REGISTRY[cfg.algorithm].protocols
    if supported and cfg.protocol not in supported:
        raise ConfigError(
            f"algorithm {cfg.algorithm!r} does not run in protocol {cfg.protocol!r}; "
            f"supported: {', '.join(supported)} (use --protocol {supported[0]})"
        )
    check_task(cfg, REGISTRY[cfg.algorithm])
    if cfg.partition not in PARTITIONS:
        raise ConfigError(
            f"unknown partition {cfg.partition!r}; choose one of: {', '.join(PARTITIONS)}"
        )
    if cfg.device not in DEVICES:
        raise ConfigError(f"unknown device {cfg.device!r}; choose one of: {', '.join(DEVICES)}")
    from fedshift.core.federation import FAILURE_POLICIES

    if cfg.failure_policy not in FAILURE_POLICIES:
        raise ConfigError(
            f"unknown failure_policy {cfg.failure_policy!r}; "
            f"choose one of: {', '.join(FAILURE_POLICIES)}"
        )
    if cfg.optimizer not in ("sgd", "adam"):
        raise ConfigError(f"unknown optimizer {cfg.optimizer!r}; choose one of: sgd, adam")
    for key in (
        "rounds",
        "local_epochs",
        "batch_size",
        "clients_per_domain",
        "eval_every",
        "min_clients",
    ):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"{key} must be >= 1, got {getattr(cfg, key)}")
    if not 0 < cfg.fraction <= 1:
        raise ConfigError(f"fraction must be in (0, 1], got {cfg.fraction}")
    if not 0 < cfg.client_data_fraction <= 1:
        raise ConfigError(f"client_data_fraction must be in (0, 1], got {cfg.client_data_fraction}")
    if cfg.lr <= 0:
        raise ConfigError(f"lr must be > 0, got {cfg.lr}")
    if cfg.ways < 1 or cfg.shots < 1 or cfg.stdev < 0:
        raise ConfigError(
            f"ways and shots must be >= 1 and stdev >= 0, got ways={cfg.ways}, "
            f"shots={cfg.shots}, stdev={cfg.stdev}"
        )
    if cfg.dirichlet_alpha <= 0:
        raise ConfigError(f"dirichlet_alpha must be > 0, got {cfg.dirichlet_alpha}")


def supported_tasks(algorithm: type) -> tuple[str, ...]:
    """The tasks an algorithm class declares (``tasks``), inherited only while the subclass
    keeps the declaring class's client tasks unchanged; otherwise classification only."""
    owner = next((k for k in algorithm.__mro__ if "tasks" in vars(k)), None)
    if owner is None:
        return ("classification",)
    same = all(
        getattr(algorithm, attr) is getattr(owner, attr, None) for attr in algorithm._tasks.values()
    )
    return tuple(owner.tasks) if same else ("classification",)


def check_task(cfg: RunConfig, algorithm: type) -> None:
    """The learning task must be known, supported by the algorithm and fit the model."""
    from fedshift.models.registry import SEGMENTATION_MODELS

    if cfg.task not in TASKS:
        raise ConfigError(f"unknown task {cfg.task!r}; choose one of: {', '.join(TASKS)}")
    supported = supported_tasks(algorithm)
    if cfg.task not in supported:
        raise ConfigError(
            f"algorithm {cfg.algorithm!r} does not support task {cfg.task!r}; "
            f"supported: {', '.join(supported)}"
        )
    if cfg.task == "segmentation" and cfg.model not in SEGMENTATION_MODELS:
        raise ConfigError(
            f"task 'segmentation' needs a segmentation model ({', '.join(SEGMENTATION_MODELS)}), "
            f"got {cfg.model!r}; use --model unet"
        )
    if cfg.task == "classification" and cfg.model in SEGMENTATION_MODELS:
        raise ConfigError(f"model {cfg.model!r} segments images; use it with task=segmentation")


def resolve(file: str | None, flags: dict[str, Any], sets: list[str]) -> RunConfig:
    """Defaults < TOML file < flags < --set; unknown keys and bad values raise ConfigError."""
    from fedshift.algorithms import REGISTRY

    settings: dict[str, Any] = {}
    if file:
        settings.update(read_toml(file))
    settings.update({k: v for k, v in flags.items() if v is not None})
    settings.update(parse_set(sets))
    cfg = RunConfig()
    run_settings = {k: v for k, v in settings.items() if not k.startswith("algo.")}
    apply_settings(cfg, run_settings, None)
    if cfg.protocol in ALL_DOMAIN_PROTOCOLS and "target" not in run_settings:
        cfg.target = "all"
    if cfg.protocol == "personalized" and "target" not in run_settings:
        cfg.target = "clients"
    validate(cfg)
    algo_settings = {k: v for k, v in settings.items() if k.startswith("algo.")}
    apply_settings(cfg, algo_settings, REGISTRY[cfg.algorithm].Hparams)
    cfg.algo = dataclasses.asdict(make_hparams(cfg))
    return cfg


def make_hparams(cfg: RunConfig):
    from fedshift.algorithms import REGISTRY

    return REGISTRY[cfg.algorithm].Hparams(**cfg.algo)
