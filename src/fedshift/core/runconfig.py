"""The run configuration: one plain dataclass, the choices it allows and value coercion.

Resolving a config from files and flags and the checks that need the algorithm registry
live one layer up, in :mod:`fedshift.config`; everything here needs nothing but itself.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from fedshift.core.errors import ConfigError, did_you_mean
from fedshift.core.robust import check_aggregator_values

# Each closed choice set of a run key is declared once, as a Literal alias typing its
# RunConfig field; the tuple beside it (typing.get_args) is what messages and owners use.

#: learning problems: what a model predicts (``RunConfig.problem``)
Problem = Literal["classification", "segmentation"]
PROBLEMS: tuple[str, ...] = typing.get_args(Problem)
#: how a domain's data is split among its clients (:mod:`fedshift.data.partition`)
Partition = Literal["iid", "dirichlet", "nway-kshot", "heterogeneity"]
PARTITIONS: tuple[str, ...] = typing.get_args(Partition)
#: devices besides ``cuda:N`` (one GPU of several)
DEVICES = ("auto", "cpu", "cuda")
Optimizer = Literal["sgd", "adam"]
OPTIMIZERS: tuple[str, ...] = typing.get_args(Optimizer)
FailurePolicy = Literal["strict", "dynamic", "resilient"]
FAILURE_POLICIES: tuple[str, ...] = typing.get_args(FailurePolicy)
#: clients of a call run together (:mod:`fedshift.engine.simulation.vectorized`); auto: on
#: with CUDA
Vectorize = Literal["auto", "off", "on"]
VECTORIZE: tuple[str, ...] = typing.get_args(Vectorize)
Augment = Literal["auto", "none", "domainbed", "cifar"]
AUGMENTS: tuple[str, ...] = typing.get_args(Augment)
#: where ``augment=domainbed`` runs (``RunConfig.augment_backend``, :mod:`fedshift.data.augment`)
AugmentBackend = Literal["auto", "batched", "pil"]
AUGMENT_BACKENDS: tuple[str, ...] = typing.get_args(AugmentBackend)
#: input normalizations a backbone can expect (:mod:`fedshift.models.base`): ``symmetric`` is
#: fedshift's [-1, 1] input as is; ``imagenet`` re-normalizes it with ImageNet's mean and std
Normalization = Literal["symmetric", "imagenet"]
NORMALIZATIONS: tuple[str, ...] = typing.get_args(Normalization)
#: the run key ``normalize``: a normalization, or auto (imagenet for torchvision weights)
Normalize = Literal["auto", Normalization]
NORMALIZE: tuple[str, ...] = typing.get_args(Normalize)
#: experiment loggers (run key ``tracking``, a comma list) -> the module each one needs; the
#: pip extra that installs it has the logger's name (``pip install 'fedshift[wandb]'``)
TRACKERS: dict[str, str] = {
    "none": "",
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "mlflow": "mlflow",
}
#: simulated attacks (``RunConfig.attack``), in :mod:`fedshift.engine.simulation.attacks`
Attack = Literal["sign-flip", "alie", "ipm", "label-flip", "proto-poison"]
ATTACKS: tuple[str, ...] = typing.get_args(Attack)
#: how the summary's target_accuracy picks its round (``RunConfig.model_selection``)
ModelSelection = Literal["source-val", "algorithm"]
MODEL_SELECTIONS: tuple[str, ...] = typing.get_args(ModelSelection)
#: training precision (:class:`fedshift.core.context.MixedPrecision`): fp32, or autocast of the
#: forward passes to bf16 / fp16 (weights stay fp32); auto: bf16 on a CUDA device that
#: supports it, fp32 otherwise
Precision = Literal["fp32", "bf16", "fp16", "auto"]
PRECISIONS: tuple[str, ...] = typing.get_args(Precision)
#: channels_last memory format of convolutional models; auto: on with CUDA
ChannelsLast = Literal["auto", "on", "off"]
#: default: each catalog entry's own protocol; full: the whole official files where that
#: protocol samples them down (Digit-Five's KD3A/FACT cap)
CatalogSplit = Literal["default", "full"]
CHANNELS_LAST: tuple[str, ...] = typing.get_args(ChannelsLast)
#: run keys renamed since they were introduced: old name -> new name (still accepted)
RENAMED_KEYS = {"task": "problem", "resolution": "image_size"}
#: other names a run key answers to, silently: the papers' symbol (``lambda``) -> the key
KEY_ALIASES = {"lambda": "heterogeneity_lambda"}


@dataclass
class RunConfig:
    """Everything that defines a run (the algorithm's own hyperparameters live in ``algo``)."""

    algorithm: str = "fedavg"
    dataset: str = "digits-dg"
    target: str = "mnistm"  # held-out domain (leave-one-domain-out)
    sources: str = ""  # comma-separated source domains; empty: every domain but the target
    protocol: str = "lodo"  # one of fedshift.scenarios.PROTOCOLS (checked in fedshift.config)
    problem: Problem = "classification"  # or "segmentation": per-pixel masks, Dice (model unet)
    rounds: int = 30
    local_epochs: int = 1
    batch_size: int = 64
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 5e-4
    optimizer: Optimizer = "sgd"
    model: str = "cnn"
    # the backbone's starting weights: a local state-dict file, or "imagenet" (torchvision's
    # file from torch's cache, hash-checked; never downloaded)
    model_weights: str = ""
    # input normalization: symmetric ([-1, 1]), imagenet (ImageNet mean/std), auto: imagenet
    # when model_weights is a torchvision (ImageNet-pretrained) state_dict
    normalize: Normalize = "auto"
    server_data: str = ""  # "domain" or "domain:split" the server holds unlabeled (PerAda)
    image_size: int = 0  # 0: the dataset's default (digits-dg 32, pacs 224, a folder 64)
    data_root: str = ""  # where a catalog dataset lies: `fedshift datasets list`
    split_seed: int = 0  # seeds the train/val/test split of a folder dataset
    # a folder of your own <domain>_{train,val,test}.txt lists for a catalog dataset
    split_files: str = ""
    # default: the catalog entry's own protocol; full: the whole official train and test
    # files where that protocol samples them down (Digit-Five: KD3A/FACT's 25,000 / 9,000)
    catalog_split: CatalogSplit = "default"
    # training-batch augmentation: none, domainbed (DomainBed's crop/flip/jitter/grayscale),
    # cifar (4-px reflect pad, random crop back, horizontal flip: MOON's CIFAR transform);
    # auto: domainbed for the catalog photo datasets, none otherwise (CIFAR, digits-dg, folders)
    augment: Augment = "auto"
    # where augment=domainbed runs: batched (kornia, whole batches on the run's device), pil
    # (image by image on PIL, as DomainBed); auto: batched on CUDA, pil on the CPU (faster there)
    augment_backend: AugmentBackend = "auto"
    # clients each domain is split into: one count for every domain, or per domain as
    # "DOMAIN:N,..." (e.g. "mnist:3,usps:7"; a domain not named gets 1; see per_domain_value)
    clients_per_domain: int | str = 1
    partition: Partition = "iid"  # how a domain is split among its clients
    dirichlet_alpha: float = 0.5
    ways: int = 3  # partition=nway-kshot: mean classes per client (FedProto's N)
    shots: int = 100  # partition=nway-kshot: train samples per class (FedProto's K)
    stdev: int = 2  # partition=nway-kshot: spread of ways and shots around their means
    # partition=nway-kshot: test samples per class per client, disjoint across clients
    # (FedProto's MNIST: 40); 0: every test sample of the client's classes
    test_shots: int = 0
    # partition=heterogeneity (FedDG-Benchmark's lambda, `--set lambda=` works too): 1 every
    # client has the same domain mix, 0 each client holds one domain
    heterogeneity_lambda: float = 0.1
    # per-client model variants, e.g. "fedproto" or "out_channels=10/18;out_channels=10/20":
    # ';' separates variants, ',' options, '/' tuple items; clients get variants in blocks
    hetero_models: str = ""
    fraction: float = 1.0  # share of source clients sampled each round (McMahan's C)
    # share of its train split each client keeps (FPL): one fraction, or per domain as
    # "DOMAIN:F,..." (e.g. "mnist:0.03,usps:0.07"; a domain not named keeps all of it)
    client_data_fraction: float | str = 1.0
    seed: int = 0
    device: str = "auto"
    # CPU threads for torch; 0: torch's default (one per core) capped at the cores that other
    # processes leave free
    threads: int = 0
    failure_policy: FailurePolicy = "dynamic"
    min_clients: int = 1
    eval_every: int = 1
    # the source (non-target) domains' val/test scored every N evaluated rounds and in the
    # last; the held-out target is scored in every evaluated round
    source_eval_every: int = 1
    # which round's model the summary's target_accuracy reports: source-val (DomainBed's
    # training-domain validation), or algorithm: the method's own label-free score (FACT:
    # min IDD, as its paper selects); the other stays in the summary under its own key
    model_selection: ModelSelection = "source-val"
    # samples per forward pass when scoring; 0: by device and image size (CPU: 256 at >= 128
    # px, 1000 below; GPU: 1024)
    eval_batch_size: int = 0
    # personal models (Ditto's, PerAda's v_k) scored every N rounds and in the last;
    # 0: every round up to 100 clients, every 10th round beyond
    personal_eval_every: int = 0
    checkpoint_every: int = 1  # save a checkpoint every N rounds and after the last
    # run a call's clients together (vmap) where a task allows: on, off, auto (on with CUDA)
    vectorize: Vectorize = "auto"
    # training precision: fp32; bf16 or fp16 autocast the forward passes of training and
    # evaluation (weights and checkpoints stay fp32; fp16 scales losses); auto (default):
    # bf16 on a CUDA device that supports it, else fp32 (so CPU runs are fp32)
    precision: Precision = "auto"
    # channels_last memory format for convolutional models: on, off, auto (on with CUDA)
    channels_last: ChannelsLast = "auto"
    # torch.compile each model built for training and evaluation (nn.Module.compile, the
    # default mode; checkpoint and reply keys unchanged); false (default): eager. Needs a
    # C++ compiler on the CPU and Triton on CUDA, checked at startup; the vectorized path
    # is not compiled, so vectorize=auto runs clients sequentially under compile=true
    compile: bool = False
    # a client's reply holding a floating value beyond +-max_reply_value is refused; 0: off
    max_reply_value: float = 1e6
    # inject client faults in the simulation engine, e.g. "raise@2:1,nan@3:*" (see
    # fedshift.engine.simulation.faults): KIND@ROUND:CLIENT, '*' for any round or client
    faults: str = ""
    # experiment loggers beside metrics.jsonl (fedshift.engine.run.tracking): a comma list of
    # tensorboard, wandb, mlflow; or none. It may change on --resume
    tracking: str = "tensorboard"
    # client-level differential privacy (docs/privacy.md): clip norm C of a client's model
    # update or class prototype, 0: off; Gaussian noise multiplier z (std z*C/n); the delta
    # of the reported epsilon; classes a client holds fewer examples of are withheld
    dp_clip: float = 0.0
    dp_noise: float = 1.0
    dp_delta: float = 1e-5
    dp_min_count: int = 5
    # how the server combines what clients send (models, prototypes): mean (weighted, as
    # each paper), median, trimmed-mean, krum, multi-krum, bulyan (fedshift.core.robust)
    aggregator: str = "mean"
    aggregator_f: int = 1  # Byzantine clients krum, multi-krum and bulyan must withstand
    trim_beta: float = 0.1  # trimmed-mean: share dropped at each end of every coordinate
    # simulate malicious clients (simulation engine, fedshift.engine.simulation.attacks): sign-flip,
    # alie, ipm, label-flip, proto-poison; attack_clients: a count N (the N first source
    # clients) or ids:I,J; attack_strength: the attack's scale (0: its default)
    attack: str = ""
    attack_clients: str = "1"
    attack_strength: float = 0.0
    # the paper preset the run started from (`fedshift list presets`, or a TOML path): its
    # settings lie below every file, flag and --set; preset_sha256 is filled in by the
    # resolver with the SHA-256 of the preset file, so config.json records which one ran
    preset: str = ""
    preset_sha256: str = ""
    algo: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


RUN_KEYS = [f.name for f in dataclasses.fields(RunConfig) if f.name != "algo"]


def field_type(cls: type, name: str) -> Any:
    """The declared type of dataclass field ``name`` (``X | None`` -> ``X``; a per-domain
    union such as ``int | str`` is kept whole, for :func:`coerce`)."""
    hint = typing.get_type_hints(cls)[name]
    if isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


#: the per-domain field types: one number for every domain, or "DOMAIN:NUMBER,..."
PER_DOMAIN_KINDS = {int | str: int, float | str: float}


def parse_per_domain(text: str, number: type, key: str) -> dict[str, int | float]:
    """``"mnist:3,usps:7"`` -> ``{"mnist": 3, "usps": 7}``; a one-line ConfigError for a
    malformed item, a repeated domain or a value that is not a ``number``."""
    values: dict[str, int | float] = {}
    for item in text.split(","):
        domain, sep, raw = (part.strip() for part in item.partition(":"))
        if not sep or not domain or not raw:
            raise ConfigError(
                f"{key} {text!r}: item {item.strip()!r} is not DOMAIN:{number.__name__.upper()}"
                f" (e.g. {key}=mnist:3,usps:7, or one {number.__name__} for every domain)"
            )
        if domain in values:
            raise ConfigError(f"{key} {text!r} names domain {domain!r} twice")
        values[domain] = coerce_number(raw, number, f"{key} of domain {domain!r}")
    return values


def coerce_number(value: Any, number: type, key: str) -> int | float:
    """``value`` as an int or float (an int takes no fraction, neither takes a bool)."""
    try:
        if isinstance(value, bool):
            raise ValueError(value)
        if number is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{key} expects {number.__name__}, got {value!r}") from None


def coerce_per_domain(value: Any, number: type, key: str) -> int | float | str:
    """A per-domain key's value: one number, or a ``DOMAIN:NUMBER`` list (or a mapping, from
    Python or a ``--config`` table) normalized to ``"a:1,b:2"`` (so files, ``--set`` and a
    resumed config.json compare equal)."""
    if isinstance(value, dict):
        value = ",".join(f"{domain}:{n}" for domain, n in value.items())
    if isinstance(value, str) and ":" in value:
        items = parse_per_domain(value, number, key)
        return ",".join(f"{domain}:{n}" for domain, n in items.items())
    try:
        return coerce_number(value, number, key)
    except ConfigError:
        kind = number.__name__
        raise ConfigError(
            f"{key} expects {kind} or DOMAIN:{kind.upper()},... (e.g. mnist:3,usps:7), "
            f"got {value!r}"
        ) from None


def per_domain_value(
    value: int | float | str, key: str, domains: typing.Sequence[str], default: int | float
) -> dict[str, int | float]:
    """Every domain of ``domains`` -> its value of per-domain key ``key``: the one number, or
    the listed one (``default`` for a domain not listed); a listed name that is not one of
    ``domains`` is a ConfigError naming the valid ones."""
    if not isinstance(value, str):
        return dict.fromkeys(domains, value)
    number = int if isinstance(default, int) else float
    listed = parse_per_domain(value, number, key)
    for domain in listed:
        if domain not in domains:
            raise ConfigError(
                f"{key} names unknown domain {domain!r}{did_you_mean(domain, list(domains))}; "
                f"domains: {', '.join(domains)}"
            )
    return {domain: listed.get(domain, default) for domain in domains}


def coerce(value: Any, kind: Any, key: str) -> Any:
    """Convert a TOML or command-line value to the field's type, or raise ConfigError.

    ``kind`` is ``bool``, ``int``, ``float``, ``str``, a ``Literal[...]`` of strings
    (a choice: any other value is an error naming the choices, as :func:`check_choice`) or a
    per-domain union (:data:`PER_DOMAIN_KINDS`, see :func:`coerce_per_domain`).
    """
    if kind in PER_DOMAIN_KINDS:
        return coerce_per_domain(value, PER_DOMAIN_KINDS[kind], key)
    if typing.get_origin(kind) is Literal:
        text = str(value)
        check_choice(key, text, typing.get_args(kind))
        return text
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
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{key} expects {kind.__name__}, got {value!r}") from None
    return value


def check_choice(key: str, value: str, choices: typing.Iterable[str]) -> None:
    """Raise ConfigError naming the choices unless ``value`` is one of them."""
    choices = tuple(choices)
    if value not in choices:
        raise ConfigError(
            f"unknown {key} {value!r}{did_you_mean(value, choices)}; "
            f"choose one of: {', '.join(choices)}"
        )


def check_choice_device(device: str) -> None:
    """A device is one of :data:`DEVICES` or ``cuda:N`` (one GPU of several)."""
    if re.fullmatch(r"cuda:\d+", str(device)) is None:
        check_choice("device", device, (*DEVICES, "cuda:N"))


def tracking_loggers(text: str) -> list[str]:
    """The experiment loggers a ``tracking`` value names (``none``: no logger), checked: each
    a known name whose package is installed; otherwise a one-line ConfigError."""
    names = [part.strip() for part in text.split(",") if part.strip()]
    if not names:
        raise ConfigError(
            f"tracking {text!r} names no logger; give a comma list of "
            f"{', '.join(n for n in TRACKERS if n != 'none')}, or none"
        )
    for name in names:
        check_choice("tracking", name, TRACKERS)
    if "none" in names:
        if len(names) > 1:
            raise ConfigError(f"tracking {text!r}: 'none' cannot be combined with a logger")
        return []
    if len(set(names)) != len(names):
        raise ConfigError(f"tracking {text!r} names a logger twice")
    for name in names:
        if importlib.util.find_spec(TRACKERS[name]) is None:
            raise ConfigError(
                f"tracking {name!r} needs the {TRACKERS[name]} package, which is not "
                f"installed: pip install 'fedshift[{name}]'"
            )
    return names


def check_run_values(cfg: RunConfig) -> None:
    """The checks of a run config that need no registry: choices and ranges."""
    check_choice("problem", cfg.problem, PROBLEMS)
    check_choice("partition", cfg.partition, PARTITIONS)
    check_choice_device(cfg.device)
    check_choice("failure_policy", cfg.failure_policy, FAILURE_POLICIES)
    check_choice("optimizer", cfg.optimizer, OPTIMIZERS)
    check_choice("vectorize", cfg.vectorize, VECTORIZE)
    check_choice("augment", cfg.augment, AUGMENTS)
    check_choice("augment_backend", cfg.augment_backend, AUGMENT_BACKENDS)
    check_choice("normalize", cfg.normalize, NORMALIZE)
    check_choice("precision", cfg.precision, PRECISIONS)
    check_choice("model_selection", cfg.model_selection, MODEL_SELECTIONS)
    check_choice("channels_last", cfg.channels_last, CHANNELS_LAST)
    tracking_loggers(cfg.tracking)
    for key in ("personal_eval_every", "eval_batch_size"):
        if getattr(cfg, key) < 0:
            raise ConfigError(f"{key} must be >= 0 (0: automatic), got {getattr(cfg, key)}")
    for item in dataclasses.fields(cfg):
        value = getattr(cfg, item.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{item.name} must be a finite number, got {value}")
    for key in (
        "rounds",
        "local_epochs",
        "batch_size",
        "eval_every",
        "source_eval_every",
        "checkpoint_every",
        "min_clients",
    ):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"{key} must be >= 1, got {getattr(cfg, key)}")
    if not 0 < cfg.fraction <= 1:
        raise ConfigError(f"fraction must be in (0, 1], got {cfg.fraction}")
    check_per_domain_ranges(cfg)
    if cfg.lr <= 0:
        raise ConfigError(f"lr must be > 0, got {cfg.lr}")
    if cfg.momentum < 0 or cfg.weight_decay < 0:
        raise ConfigError(
            f"momentum and weight_decay must be >= 0, got momentum={cfg.momentum}, "
            f"weight_decay={cfg.weight_decay}"
        )
    if cfg.test_shots < 0:
        raise ConfigError(f"test_shots must be >= 0, got {cfg.test_shots}")
    if cfg.ways < 1 or cfg.shots < 1 or cfg.stdev < 0:
        raise ConfigError(
            f"ways and shots must be >= 1 and stdev >= 0, got ways={cfg.ways}, "
            f"shots={cfg.shots}, stdev={cfg.stdev}"
        )
    if not 0 <= cfg.heterogeneity_lambda <= 1:
        raise ConfigError(
            f"heterogeneity_lambda (lambda) must be in [0, 1], got {cfg.heterogeneity_lambda}"
        )
    if cfg.dirichlet_alpha <= 0:
        raise ConfigError(f"dirichlet_alpha must be > 0, got {cfg.dirichlet_alpha}")
    check_aggregator_values(cfg.aggregator, cfg.aggregator_f, cfg.trim_beta)
    if cfg.attack:
        check_choice("attack", cfg.attack, ATTACKS)
    if cfg.attack_strength < 0:
        raise ConfigError(f"attack_strength must be >= 0 (0: default), got {cfg.attack_strength}")
    if cfg.max_reply_value < 0:
        raise ConfigError(f"max_reply_value must be >= 0 (0: off), got {cfg.max_reply_value}")
    if cfg.dp_clip < 0:
        raise ConfigError(f"dp_clip must be >= 0 (0: no differential privacy), got {cfg.dp_clip}")
    if cfg.dp_clip > 0 and cfg.dp_noise <= 0:
        raise ConfigError(f"dp_noise must be > 0 when dp_clip is set, got {cfg.dp_noise}")
    if not 0 < cfg.dp_delta < 1:
        raise ConfigError(f"dp_delta must be in (0, 1), got {cfg.dp_delta}")
    if cfg.dp_min_count < 1:
        raise ConfigError(f"dp_min_count must be >= 1, got {cfg.dp_min_count}")


def check_per_domain_ranges(cfg: RunConfig) -> None:
    """Every client count >= 1 and every data fraction in (0, 1], per domain or not (the
    domain names are checked against the dataset where the clients are made)."""
    counts = cfg.clients_per_domain
    for domain, count in per_domain_items(counts, int, "clients_per_domain"):
        if count < 1:
            raise ConfigError(f"clients_per_domain{domain} must be >= 1, got {count}")
    fractions = cfg.client_data_fraction
    for domain, fraction in per_domain_items(fractions, float, "client_data_fraction"):
        if not 0 < fraction <= 1:
            raise ConfigError(f"client_data_fraction{domain} must be in (0, 1], got {fraction}")


def per_domain_items(value: Any, number: type, key: str) -> list[tuple[str, Any]]:
    """``(" of domain 'd'", value)`` per listed domain, or ``("", value)`` for one number."""
    if isinstance(value, str):
        items = parse_per_domain(value, number, key).items()
        return [(f" of domain {domain!r}", n) for domain, n in items]
    return [("", value)]


def listed_domains(text: str, names: list[str], dataset: str, noun: str = "domain") -> list[str]:
    """Parse a comma-separated domain list (``--sources``) against the dataset's domains."""
    domains = [part.strip() for part in text.split(",") if part.strip()]
    if not domains:
        raise ConfigError(
            f"sources {text!r} names no domain; give comma-separated domains of {dataset} "
            f"({', '.join(names)}) or leave it out for every domain but the target"
        )
    unknown = [d for d in domains if d not in names]
    if unknown:
        raise ConfigError(
            f"unknown {noun} {unknown[0]!r} for {dataset}; choose from: {', '.join(names)}"
        )
    if len(set(domains)) != len(domains):
        raise ConfigError(f"domains repeat in sources: {text}")
    return domains
