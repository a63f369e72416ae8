"""The run configuration: one plain dataclass, the choices it allows and value coercion.

Resolving a config from files and flags and the checks that need the algorithm registry
live one layer up, in :mod:`fedshift.config`; everything here needs nothing but itself.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from fedshift.core.declare import (
    CHOICES_MARK,
    FieldInfo,
    Search,
    check_choice,
    check_declared,
    declared,
    describe_fields,
    field_type,
    log_uniform,
)
from fedshift.core.declare import (  # the general value checks live there (re-exported)
    PER_DOMAIN_KINDS as PER_DOMAIN_KINDS,
)
from fedshift.core.declare import (
    coerce as coerce,
)
from fedshift.core.declare import (
    coerce_number as coerce_number,
)
from fedshift.core.declare import (
    coerce_per_domain as coerce_per_domain,
)
from fedshift.core.declare import (
    parse_per_domain as parse_per_domain,
)
from fedshift.core.declare import (
    per_domain_value as per_domain_value,
)
from fedshift.core.errors import ConfigError

# Each closed choice set of a run key is declared once, as a Literal alias typing its
# RunConfig field; the tuple beside it (typing.get_args) is what messages and owners use.

#: learning problems: what a model predicts (``RunConfig.problem``)
Problem = Literal["classification", "segmentation"]
PROBLEMS: tuple[str, ...] = typing.get_args(Problem)
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
AugmentBackend = Literal["auto", "batched", "fused", "pil"]
AUGMENT_BACKENDS: tuple[str, ...] = typing.get_args(AugmentBackend)
#: input normalizations a backbone can expect (:mod:`fedshift.models.base`): ``symmetric`` is
#: fedshift's [-1, 1] input as is; ``imagenet`` re-normalizes it with ImageNet's mean and std,
#: ``mnist`` with MNIST's (0.1307, 0.3081) on every channel
Normalization = Literal["symmetric", "imagenet", "mnist"]
NORMALIZATIONS: tuple[str, ...] = typing.get_args(Normalization)
#: the run key ``normalize``: a normalization, or auto (imagenet for torchvision weights)
Normalize = Literal["auto", Normalization]
NORMALIZE: tuple[str, ...] = typing.get_args(Normalize)
#: where each client's weights start (``RunConfig.client_init``): ``shared``, one seeded init
#: for every client (the server's); ``own``, each client its own seeded init
ClientInit = Literal["shared", "own"]
CLIENT_INITS: tuple[str, ...] = typing.get_args(ClientInit)
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
#: channels_last memory format of convolutional models; auto: on with CUDA, and on the CPU
#: for models that ask for it (EfficientNet-Lite)
ChannelsLast = Literal["auto", "on", "off"]
#: default: each catalog entry's own protocol; full: the whole official files where that
#: protocol samples them down (Digit-Five's KD3A/FACT cap)
CatalogSplit = Literal["default", "full"]
#: what ``client_data_fraction`` is a fraction of: the client's part of its domain's train
#: split, or its domain's training images (train + val: all but the test images)
ClientDataOf = Literal["share", "domain"]
CHANNELS_LAST: tuple[str, ...] = typing.get_args(ChannelsLast)
#: the CPU's numeric path (:mod:`fedshift.core.numerics`): pinned kernels (the same numbers
#: on every x86-64 machine kind) or the CPU's native ones (faster on a wider CPU)
CpuNumerics = Literal["pinned", "native"]
#: run keys renamed since they were introduced: old name -> new name (still accepted)
RENAMED_KEYS = {"task": "problem", "resolution": "image_size"}
#: other names a run key answers to, silently: the papers' symbol (``lambda``) -> the key
KEY_ALIASES = {"lambda": "heterogeneity_lambda"}


#: what a ``--resume`` may do with a run key: keep it (``fixed``), change it (``may-change``:
#: where and how the run is watched) or raise it (``may-grow``: more rounds extend a run);
#: :func:`fedshift.core.runfiles.resume_conflict` applies the rule
FIXED, MAY_CHANGE, MAY_GROW = "fixed", "may-change", "may-grow"
RESUME_RULES = (FIXED, MAY_CHANGE, MAY_GROW)

#: the sections run keys are declared in -> what they hold (``fedshift show run`` and the
#: run-keys page list them in this order)
SECTIONS: dict[str, str] = {
    "task": "what is learned, from which data, under which protocol",
    "data": "where the data lies and how it is read",
    "partition": "how each domain's data is split among its clients",
    "model": "the backbone and its starting weights",
    "training": "each client's local training (shared by every algorithm)",
    "federation": "which clients take part in a round and which replies count",
    "run": "length, seed, checkpoints, loggers and the preset a run started from",
    "evaluation": "what is scored when, and which round the summary reports",
    "hardware": "device, threads, precision and compilation (speed, not what is computed)",
    "robustness": "robust aggregation, simulated attacks and faults",
    "privacy": "client-level differential privacy",
}


def key(
    default: Any,
    help: str,
    *,
    group: str,
    symbol: str = "",
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    search: Search | None = None,
    resume: str = FIXED,
    choices: str = "",
) -> Any:
    """One run key, declared as an algorithm's hyperparameter is (:func:`fedshift.core.
    hparams.hp`): its default, meaning (``help``), the paper's ``symbol``, its range, the
    distribution ``fedshift sweep --random`` draws it from, plus the section (``group``) it
    belongs to, what ``--resume`` may do with it (``resume``, one of :data:`RESUME_RULES`) and
    the registry its value names (``choices``, ``module:attribute``): ``{choices}`` in ``help``
    becomes that registry's names when the key is described, so the help cannot fall behind."""
    if bool(choices) != (CHOICES_MARK in help):
        raise TypeError(f"a run key's help says {CHOICES_MARK} exactly when it names choices=")
    if group not in SECTIONS:
        raise TypeError(f"unknown section {group!r}; choose one of: {', '.join(SECTIONS)}")
    if resume not in RESUME_RULES:
        raise TypeError(f"unknown resume rule {resume!r}; choose one of: {', '.join(RESUME_RULES)}")
    return declared(
        default,
        symbol,
        help,
        low,
        high,
        low_open,
        high_open,
        search,
        group=group,
        resume=resume,
        choices=choices,
    )


@dataclass
class RunConfig:
    """Everything that defines a run (the algorithm's own hyperparameters live in ``algo``).

    The config stays flat (``config.json``, presets, TOML files, ``--set``, the Flower run
    config and checkpoints name each key alone); each key's :func:`key` declaration holds its
    meaning, range, section and resume rule, which ``fedshift show run``, the run-keys page,
    the range check, ``--random`` and ``--resume`` all read."""

    # -- task
    algorithm: str = key(
        "fedavg",
        "the algorithm (`fedshift list algorithms`), or a plug-in as package.module:Class",
        group="task",
    )
    dataset: str = key(
        "digits-dg",
        "the dataset: a catalog name, digits-dg, a registered or plug-in dataset, or a folder; "
        "NAME:d1,d2 keeps only the listed domains",
        group="task",
    )
    target: str = key("mnistm", "the held-out target domain (leave-one-domain-out)", group="task")
    sources: str = key(
        "", "comma-separated source domains; empty: every domain but the target", group="task"
    )
    protocol: str = key(
        "lodo",
        "the evaluation protocol: {choices}",
        group="task",
        choices="fedshift.scenarios:PROTOCOLS",
    )
    problem: Problem = key(
        "classification",
        "what a model predicts: classification, or segmentation (per-pixel masks, Dice; "
        "model unet)",
        group="task",
    )
    # -- data
    server_data: str = key(
        "",
        'the unlabeled data the server holds (PerAda): "domain" or "domain:split"; empty: none',
        group="data",
    )
    image_size: int = key(
        0,
        "image side in pixels; 0: the dataset's (digits-dg 32, pacs 224, a folder 64)",
        group="data",
    )
    data_root: str = key(
        "", "where a catalog dataset lies (`fedshift datasets list`)", group="data"
    )
    split_seed: int = key(0, "seeds the train/val/test split of a folder dataset", group="data")
    split_files: str = key(
        "",
        "a folder of your own <domain>_{train,val,test}.txt lists for a catalog dataset",
        group="data",
    )
    catalog_split: CatalogSplit = key(
        "default",
        "default: the catalog entry's own protocol; full: the whole official train and test "
        "files where that protocol samples them down (Digit-Five: KD3A/FACT's 25,000 / 9,000)",
        group="data",
    )
    augment: Augment = key(
        "auto",
        "training-batch augmentation: none, domainbed (DomainBed's crop/flip/jitter/grayscale), "
        "cifar (4-px reflect pad, random crop back, horizontal flip: MOON's CIFAR transform); "
        "auto: domainbed for the catalog photo datasets, none otherwise",
        group="data",
    )
    augment_backend: AugmentBackend = key(
        "auto",
        "where augment=domainbed runs: batched (kornia, whole batches on the run's device), fused "
        "(crop and flip as one affine grid, jitter as batched tensor ops, on the run's device), "
        "pil (image by image, as DomainBed); auto: batched on CUDA, pil on the CPU",
        group="data",
    )
    client_data_fraction: float | str = key(
        1.0,
        "share of its train split each client keeps (FPL): one fraction, or per domain as "
        '"DOMAIN:F,..." (a domain not named keeps all of it); of what: client_data_of',
        group="data",
        low=0,
        high=1,
        low_open=True,
    )
    client_data_of: ClientDataOf = key(
        "share",
        "what client_data_fraction is a fraction of: share (the client's part of its domain's "
        "train split), domain (its domain's train + val images: each client keeps "
        "int(fraction x that) of its part, FPL's official percent_dict)",
        group="data",
    )
    # -- partition
    clients_per_domain: int | str = key(
        1,
        'clients each domain is split into: one count, or per domain as "DOMAIN:N,..." '
        "(a domain not named gets 1)",
        group="partition",
        low=1,
    )
    partition: str = key(
        "iid",
        "how the source data is split among clients: a scheme of fedshift.data.partitioners "
        "({choices}; `fedshift list partitions` says which split each domain on its own; "
        "checked in fedshift.config)",
        group="partition",
        choices="fedshift.data.partitioners:PARTITIONERS",
    )
    dirichlet_alpha: float = key(
        0.5,
        "partition=dirichlet: concentration of the label Dirichlet (smaller: more skew)",
        symbol="α",
        group="partition",
        low=0,
        low_open=True,
    )
    ways: int = key(
        3, "partition=nway-kshot: mean classes per client", symbol="N", group="partition", low=1
    )
    shots: int = key(
        100,
        "partition=nway-kshot: train samples per class",
        symbol="K",
        group="partition",
        low=1,
    )
    stdev: int = key(
        2,
        "partition=nway-kshot: spread of ways and shots around their means",
        group="partition",
        low=0,
    )
    test_shots: int = key(
        0,
        "partition=nway-kshot: test samples per class per client, disjoint across clients "
        "(FedProto's MNIST: 40); 0: every test sample of the client's classes",
        group="partition",
        low=0,
    )
    heterogeneity_lambda: float = key(
        0.1,
        "partition=heterogeneity (FedDG-Benchmark; `--set lambda=` works too): 1 every client "
        "has the same domain mix, 0 each client holds one domain",
        symbol="λ",
        group="partition",
        low=0,
        high=1,
    )
    # -- model
    model: str = key(
        "cnn",
        "the backbone (`fedshift list models`; default: the algorithm's own, else cnn), or a "
        "plug-in as package.module:builder",
        group="model",
    )
    model_weights: str = key(
        "",
        "the backbone's starting weights: a local state-dict file (torch or safetensors), or "
        "imagenet: the file the model's card pins (`fedshift list models`: torchvision's in "
        "torch's cache, a registry package's, timm's in the local Hugging Face cache), "
        "checked; never downloaded; empty: random",
        group="model",
    )
    normalize: Normalize = key(
        "auto",
        "input normalization: symmetric ([-1, 1]), imagenet (ImageNet mean/std), mnist "
        "((x01 - 0.1307) / 0.3081 on every channel, x01 the image in [0, 1]: the official "
        "FedProto/torchvision MNIST input); auto: imagenet when model_weights is a torchvision "
        "(ImageNet-pretrained) state_dict or timm weights expecting ImageNet's, else symmetric",
        group="model",
    )
    input_channels: int = key(
        0,
        "input channels of the backbone: 0, the dataset's; 1, one channel: the backbone's "
        "first layer takes 1 channel and it sees the mean over the image's channels (exact "
        "for gray sources stored as identical channels, e.g. Digit-Five's MNIST; for color "
        "images an unweighted gray), before any normalize",
        group="model",
        low=0,
        high=1,
    )
    hetero_models: str = key(
        "",
        'per-client model variants, e.g. "fedproto" or "out_channels=10/18;out_channels=10/20": '
        "';' separates variants, ',' options, '/' tuple items; clients get variants in blocks",
        group="model",
    )
    client_init: ClientInit = key(
        "shared",
        "where each client's weights start: shared (one seeded init, the server's, for every "
        "client) or own (each client its own seeded init, as FedProto's official code builds "
        "one model per client); own only for algorithms that send no model weights",
        group="model",
    )
    # -- training
    local_epochs: int = key(
        1, "epochs of local training per round", symbol="E", group="training", low=1
    )
    batch_size: int = key(64, "local mini-batch size", symbol="B", group="training", low=1)
    lr: float = key(
        0.01,
        "learning rate of the local optimizer",
        symbol="η",
        group="training",
        low=0,
        low_open=True,
        search=log_uniform(1e-3, 1e-1),
    )
    momentum: float = key(0.9, "momentum of the local optimizer", group="training", low=0)
    weight_decay: float = key(
        5e-4,
        "L2 weight decay of the local optimizer",
        group="training",
        low=0,
        search=log_uniform(1e-6, 1e-2),
    )
    optimizer: Optimizer = key("sgd", "the local optimizer: sgd or adam", group="training")
    # -- federation
    fraction: float = key(
        1.0,
        "share of the source clients sampled each round",
        symbol="C",
        group="federation",
        low=0,
        high=1,
        low_open=True,
    )
    failure_policy: FailurePolicy = key(
        "dynamic",
        "when a round with failed clients goes on: strict (every called client), dynamic (at "
        "least min_clients), resilient (whoever replied)",
        group="federation",
    )
    min_clients: int = key(
        1, "failure_policy=dynamic: replies a round needs", group="federation", low=1
    )
    max_reply_value: float = key(
        1e6,
        "a client's reply holding a floating value beyond +-max_reply_value is refused; 0: off",
        group="federation",
        low=0,
    )
    # -- run
    rounds: int = key(30, "communication rounds", group="run", low=1, resume=MAY_GROW)
    seed: int = key(0, "seeds the run: model init, sampling, local batches", group="run")
    checkpoint_every: int = key(
        1, "save a checkpoint every N rounds and after the last", group="run", low=1
    )
    tracking: str = key(
        "tensorboard",
        "experiment loggers beside metrics.jsonl: a comma list of tensorboard, wandb, mlflow; "
        "or none",
        group="run",
        resume=MAY_CHANGE,
    )
    preset: str = key(
        "",
        "the paper preset the run started from (`fedshift list presets`, or a TOML path): its "
        "settings lie below every file, flag and --set",
        group="run",
    )
    preset_sha256: str = key(
        "",
        "the SHA-256 of the preset file, filled in by the resolver so config.json records "
        "which one ran",
        group="run",
    )
    # -- evaluation
    eval_every: int = key(
        1, "evaluate every N rounds and after the last", group="evaluation", low=1
    )
    source_eval_every: int = key(
        1,
        "the source (non-target) domains' val/test scored every N evaluated rounds and in the "
        "last; the held-out target is scored in every evaluated round",
        group="evaluation",
        low=1,
    )
    model_selection: ModelSelection = key(
        "source-val",
        "which round's model the summary's target_accuracy reports: source-val (DomainBed's "
        "training-domain validation), or algorithm (the method's own label-free score, FACT's "
        "min IDD); the other stays in the summary under its own key",
        group="evaluation",
    )
    eval_batch_size: int = key(
        0,
        "samples per forward pass when scoring; 0: by device and image size (CPU: 256 at "
        ">= 128 px, 1000 below; GPU: 1024)",
        group="evaluation",
        low=0,
    )
    personal_eval_every: int = key(
        0,
        "personal models (Ditto's, PerAda's v_k) scored every N rounds and in the last; 0: every "
        "round up to 100 clients, every 10th round beyond",
        group="evaluation",
        low=0,
    )
    # -- hardware
    device: str = key(
        "auto",
        "where the run trains: auto, cpu, cuda or cuda:N",
        group="hardware",
        resume=MAY_CHANGE,
    )
    threads: int = key(
        0,
        "CPU threads for torch; 0: one, whatever the machine's cores and load (the same "
        "numbers on an idle and a busy machine)",
        group="hardware",
        resume=MAY_CHANGE,
    )
    cpu_numerics: CpuNumerics = key(
        "pinned",
        "the CPU's numeric path: pinned (ATen AVX2, oneDNN AVX2, MKL COMPATIBLE: one seed gives "
        "the same numbers on every x86-64 machine kind) or native (the CPU's widest kernels: "
        "faster there, other last bits; needed by precision=bf16 on the CPU)",
        group="hardware",
    )
    vectorize: Vectorize = key(
        "auto",
        "run a call's clients together (vmap) where a task allows: on, off, auto (on with CUDA)",
        group="hardware",
    )
    precision: Precision = key(
        "auto",
        "training precision: fp32; bf16 or fp16 autocast the forward passes (weights and "
        "checkpoints stay fp32; fp16 scales losses); auto: bf16 on a CUDA device that supports "
        "it, else fp32",
        group="hardware",
    )
    channels_last: ChannelsLast = key(
        "auto",
        "channels_last memory format for convolutional models: on, off, auto (on with CUDA, "
        "and on the CPU for the EfficientNet-Lite backbones, faster there)",
        group="hardware",
    )
    compile: bool = key(
        False,
        "torch.compile each model built for training and evaluation (needs a C++ compiler on "
        "the CPU, Triton on CUDA; the vectorized path is not compiled, so vectorize=auto runs "
        "clients one by one under compile=true); false: eager",
        group="hardware",
    )
    # -- robustness
    faults: str = key(
        "",
        'client faults injected in the simulation engine, e.g. "raise@2:1,nan@3:*" '
        "(KIND@ROUND:CLIENT, '*' for any round or client; fedshift.engine.simulation.faults)",
        group="robustness",
    )
    aggregator: str = key(
        "mean",
        "how the server combines what clients send: {choices} (fedshift.core.robust; mean: "
        "weighted, as each paper)",
        group="robustness",
        choices="fedshift.core.aggregator_names:AGGREGATORS",
    )
    aggregator_f: int = key(
        1,
        "Byzantine clients krum, multi-krum and bulyan must withstand",
        symbol="f",
        group="robustness",
        low=0,
    )
    trim_beta: float = key(
        0.1,
        "trimmed-mean: share dropped at each end of every coordinate",
        symbol="β",
        group="robustness",
        low=0,
        high=0.5,
        high_open=True,
    )
    attack: str = key(
        "",
        "simulated malicious clients (simulation engine): {choices}; empty: none",
        group="robustness",
        choices="fedshift.core.runconfig:ATTACKS",
    )
    attack_clients: str = key(
        "1",
        "the attackers: a count N (the N first source clients) or ids:I,J",
        group="robustness",
    )
    attack_strength: float = key(
        0.0, "the attack's scale; 0: its default", group="robustness", low=0
    )
    # -- privacy
    dp_clip: float = key(
        0.0,
        "client-level differential privacy (docs/privacy.md): clip norm of a client's model "
        "update or class prototype; 0: off",
        symbol="C",
        group="privacy",
        low=0,
    )
    dp_noise: float = key(
        1.0,
        "Gaussian noise multiplier (noise std z*C/m, m the round's sampled clients); > 0 when "
        "dp_clip is set",
        symbol="z",
        group="privacy",
    )
    dp_delta: float = key(
        1e-5,
        "the delta of the reported epsilon",
        symbol="δ",
        group="privacy",
        low=0,
        high=1,
        low_open=True,
        high_open=True,
    )
    dp_min_count: int = key(
        5,
        "classes a client holds fewer examples of are withheld from its prototypes",
        group="privacy",
        low=1,
    )
    algo: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def section(self, group: str) -> dict[str, Any]:
        """The values of the run keys declared in section ``group`` (``training``, ...)."""
        return {name: getattr(self, name) for name in section_keys(group)}


RUN_KEYS = [f.name for f in dataclasses.fields(RunConfig) if f.name != "algo"]


def section_keys(group: str) -> list[str]:
    """The run keys declared in section ``group``, in declaration order."""
    if group not in SECTIONS:
        raise KeyError(group)
    return [f.name for f in dataclasses.fields(RunConfig) if f.metadata.get("group") == group]


def section_dataclass(name: str, group: str, doc: str, module: str) -> type:
    """A dataclass holding the run keys of section ``group`` with their declared types and
    defaults (``TrainConfig`` is ``training``'s), so a key is declared once, in
    :class:`RunConfig`; ``cls.of(cfg)`` takes a run config's values of the section."""
    items = [
        (f.name, field_type(RunConfig, f.name), field(default=f.default))
        for f in dataclasses.fields(RunConfig)
        if f.metadata.get("group") == group
    ]

    def of(cls: type, cfg: RunConfig) -> Any:
        return cls(**cfg.section(group))

    made = dataclasses.make_dataclass(name, items, namespace={"of": classmethod(of)})
    made.__doc__, made.__module__ = doc, module
    return made


def describe_run_keys() -> list[FieldInfo]:
    """Every run key in declaration order with its meaning, range, default, section and
    resume rule: the one reader behind ``fedshift show run``, the run-keys page and the help
    of the run flags."""
    return describe_fields(RunConfig, RUN_KEYS)


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
    """The checks of a run config that need no registry: every key against its declaration
    (:func:`check_declared`), then the rules no single declaration can state."""
    check_declared(cfg)
    check_choice_device(cfg.device)
    tracking_loggers(cfg.tracking)
    from fedshift.core.robust import check_aggregator_values  # torch: only when checking

    check_aggregator_values(cfg.aggregator, cfg.aggregator_f, cfg.trim_beta)
    if cfg.attack:
        check_choice("attack", cfg.attack, ATTACKS)
    if cfg.dp_clip > 0 and cfg.dp_noise <= 0:
        raise ConfigError(f"dp_noise must be > 0 when dp_clip is set, got {cfg.dp_noise}")


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
