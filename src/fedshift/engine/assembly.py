"""Experiment assembly: from a resolved config to the scenario, models, algorithm and client
contexts of a run (everything built before the first round)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import platform
from dataclasses import dataclass, field
from typing import Any

import torch

from fedshift.algorithms import REGISTRY
from fedshift.config import make_hparams
from fedshift.core.algorithm import Algorithm, RunInfo
from fedshift.core.context import ClientContext, MixedPrecision, SplitView, TrainConfig
from fedshift.core.errors import ConfigError
from fedshift.core.privacy import PrivacySettings
from fedshift.core.record import Kind
from fedshift.core.robust import Aggregator
from fedshift.core.runconfig import RunConfig
from fedshift.core.seeding import derive_seed
from fedshift.core.split import Images
from fedshift.core.version import __version__
from fedshift.data import load_dataset
from fedshift.data.augment import (
    Augment,
    build_augment,
    resolve_augment,
    resolve_augment_backend,
)
from fedshift.data.catalog.elcfs import SETS as SEGMENTATION_SETS
from fedshift.data.domains import DomainDataset
from fedshift.data.registry import resized
from fedshift.engine.compute import (
    check_compile,
    resolve_device,
    resolve_precision,
    set_numeric_path,
    set_run_threads,
    uses_channels_last,
)
from fedshift.eval.segmentation import check_masks
from fedshift.models import build_model
from fedshift.models.registry import parse_variants, variant_of_client
from fedshift.models.weights import weights_file
from fedshift.scenarios import build_scenario, get_protocol
from fedshift.scenarios.scenario import Scenario, server_images


def model_builder(
    cfg: RunConfig,
    dataset: DomainDataset,
    options: dict | None = None,
    device: torch.device | None = None,
    client_id: int | None = None,
):
    """A function returning the same seeded initialization on every call.

    ``options`` are extra model options (a ``hetero_models`` variant); ``client_id`` gives
    that client its own seeded initialization (``client_init=own``). A segmentation
    dataset with several mask channels (fundus: disc, cup) gets one output channel each.
    The template is channels_last where :func:`uses_channels_last` says so on ``device``
    (the run's; values are unchanged, only the layout of 4-d weights)."""
    image_size = cfg.image_size or dataset.image_size
    channels = mask_channels(cfg, dataset)
    if len(channels) > 1:
        options = {"out_channels": len(channels), **(options or {})}
    with torch.random.fork_rng(devices=[]):
        own = () if client_id is None else (client_id,)
        torch.manual_seed(derive_seed(cfg.seed, "model-init", *own))
        try:
            template = build_model(
                cfg.model,
                dataset.num_classes,
                in_channels=dataset.channels,
                image_size=image_size,
                weights_path=cfg.model_weights or None,
                normalize=cfg.normalize,
                gray_input=cfg.input_channels == 1,
                **(options or {}),
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if uses_channels_last(cfg.channels_last, device or torch.device("cpu"), template):
        template = template.to(memory_format=torch.channels_last)
    return ModelBuilder(template, compile=cfg.compile)


def segmentation_only(name: str) -> str:
    """The error for a segmentation-only dataset (fundus, prostate) run as classification."""
    return (
        f"dataset {name!r} has segmentation masks, no classes: run it with "
        "--set problem=segmentation --model unet"
    )


def mask_channels(cfg: RunConfig, dataset: DomainDataset) -> list[str]:
    """The names of the dataset's mask channels in a segmentation run (one unnamed channel
    where the dataset names none), else empty."""
    if cfg.problem != "segmentation":
        return []
    return list(dataset.meta.get("mask_channels", ["foreground"]))


class ModelBuilder:
    """Builds copies of one seeded template model (one architecture).

    Calling it returns a fresh deep copy, as algorithms expect (compiled in place where the
    run says ``compile=true``: ``model(x)`` runs compiled; an algorithm calling
    ``features``/``classifier`` directly runs those eagerly). :meth:`lease` hands out a
    module kept from an earlier client call instead (about 6x cheaper than a deep copy of the
    digit CNN): inside :meth:`leasing` each lease is a distinct module, reset to the
    template's trainable flags and training mode with no gradients, and all of them return
    to the pool when the call ends. The caller must load every weight (``load_state_dict``)
    and keep no reference to the module or its tensors past the call.
    """

    def __init__(self, template: torch.nn.Module, compile: bool = False):
        self.template = template
        #: each built module is compiled in place (``nn.Module.compile``, the run key
        #: ``compile``); the template stays eager (the vectorized path calls it functionally)
        self.compile = compile
        self._free: list[torch.nn.Module] = []
        self._leased: list[torch.nn.Module] | None = None

    def __call__(self) -> torch.nn.Module:
        model = copy.deepcopy(self.template)
        if self.compile:
            # in place, not torch.compile(model): no OptimizedModule wrapper, so state_dict
            # keys (replies, checkpoints) have no ``_orig_mod.`` prefix; copies share graphs
            model.compile()
        return model

    @contextlib.contextmanager
    def leasing(self):
        """The scope of one client call: modules leased in it are reused afterwards."""
        outer, self._leased = self._leased, []
        try:
            yield self
        finally:
            self._free.extend(self._leased)
            self._leased = outer

    def lease(self) -> torch.nn.Module:
        """A module with the template's architecture whose weights the caller overwrites;
        a fresh deep copy outside :meth:`leasing`."""
        if self._leased is None:
            return self()
        model = self._free.pop() if self._free else self()
        self._reset(model)
        self._leased.append(model)
        return model

    def _reset(self, model: torch.nn.Module) -> None:
        flags = [p.requires_grad for p in self.template.parameters()]
        for param, flag in zip(model.parameters(), flags, strict=True):
            param.grad = None
            param.requires_grad_(flag)
        for module, original in zip(model.modules(), self.template.modules(), strict=True):
            module.training = original.training


def client_model_builders(
    cfg: RunConfig,
    dataset: DomainDataset,
    scenario: Scenario,
    build,
    device: torch.device | None = None,
) -> dict[int, Any]:
    """Each client's model builder: ``build`` for all, or its ``hetero_models`` variant, and
    with ``client_init=own`` each client its own seeded initialization.

    Variants go to the clients in contiguous blocks (:func:`variant_of_client`). Only
    algorithms that send no model weights can mix architectures or initializations.
    """
    variants = parse_variants(cfg.hetero_models)
    own_init = cfg.client_init == "own"
    if not variants and not own_init:
        return {c.client_id: build for c in scenario.clients}
    if Kind.MODEL in REGISTRY[cfg.algorithm].shares.values():
        what = "hetero_models" if variants else "client_init=own"
        raise ConfigError(
            f"{what} needs an algorithm that shares no model weights; "
            f"{cfg.algorithm!r} averages models (try fedproto, bd-fedproto or local)"
        )
    n = len(scenario.clients)
    if own_init:
        return {
            c.client_id: model_builder(
                cfg,
                dataset,
                variants[variant_of_client(i, n, len(variants))] if variants else None,
                device,
                client_id=c.client_id,
            )
            for i, c in enumerate(scenario.clients)
        }
    builds = [model_builder(cfg, dataset, options, device) for options in variants]
    return {
        c.client_id: builds[variant_of_client(i, n, len(builds))]
        for i, c in enumerate(scenario.clients)
    }


@contextlib.contextmanager
def building_with(algo: Algorithm, build):
    """Let ``algo`` build models with ``build`` (a client's architecture) for a while."""
    original = algo.run
    algo.run = dataclasses.replace(original, build_model=build)
    try:
        yield algo
    finally:
        algo.run = original


def personal_model(algo: Algorithm, ctx: ClientContext) -> torch.nn.Module | None:
    """A client's personal model, built with the client's own architecture."""
    with building_with(algo, ctx.build_model):
        return algo.client_model(ctx.state)


@dataclass
class Experiment:
    """Everything built from a config before the first round."""

    cfg: RunConfig
    dataset: DomainDataset
    scenario: Scenario
    algorithm: Algorithm
    contexts: dict[int, ClientContext]
    device: torch.device
    info: dict[str, Any] = field(default_factory=dict)
    #: unlabeled images the server holds (``cfg.server_data``), e.g. PerAda's KD set
    server_data: Images | None = None
    #: the resolved ``precision`` (every client context holds the same)
    precision: MixedPrecision = field(default_factory=MixedPrecision)


def client_contexts(
    scenario: Scenario,
    num_classes: int,
    builds: dict[int, Any],
    train_cfg: TrainConfig,
    device: torch.device,
    total_rounds: int,
    augment: Augment | None = None,
    precision: MixedPrecision | None = None,
) -> dict[int, ClientContext]:
    """One context per client; an unlabeled (target) client's views hide their labels.

    ``augment`` applies to the training batches of every client's train view; ``precision``
    is the run's (fp32 when not given)."""
    contexts = {}
    for client in scenario.clients:
        labeled = client.role == "source"
        contexts[client.client_id] = ClientContext(
            client_id=client.client_id,
            name=client.name,
            domain=client.domain,
            role=client.role,
            train=SplitView(client.train, labeled, device, augment),
            val=SplitView(client.val, labeled, device),
            test=SplitView(client.test, labeled, device),
            num_classes=num_classes,
            build_model=builds[client.client_id],
            rng=torch.Generator(),
            device=device,
            train_cfg=train_cfg,
            total_rounds=total_rounds,
            precision=precision or MixedPrecision(),
        )
    return contexts


#: what a dataset's ``meta`` says about its copy and split that ``config.json`` records
RECORDED_META = ("source", "root", "split", "split_seed", "split_files", "counts")


def run_info(
    cfg: RunConfig,
    dataset: DomainDataset,
    scenario: Scenario,
    device,
    inputs: dict[str, str] | None = None,
) -> dict:
    """What ``config.json`` records beside the config: versions, device, clients and sizes,
    and ``inputs``: the training augmentation and input normalization the run resolved."""
    return {
        "fedshift_version": __version__,
        "torch_version": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
        # the CPU threads the run used (threads=0: one): float results depend on it, so
        # --resume of a threads=0 run keeps it (a run from before threads=0 meant one)
        "threads": torch.get_num_threads(),
        "sources": scenario.sources,
        "targets": scenario.targets,
        "clients": [
            {
                "id": c.client_id,
                "name": c.name,
                "domain": c.domain,
                "role": c.role,
                "train": len(c.train),
                "val": len(c.val),
                "test": len(c.test),
            }
            for c in scenario.clients
        ],
        **({"inputs": inputs} if inputs else {}),
        "dataset_meta": {
            "classes": dataset.classes,
            "image_size": dataset.image_size,
            **{k: dataset.meta[k] for k in RECORDED_META if k in dataset.meta},
        },
    }


def privacy_settings(cfg: RunConfig) -> PrivacySettings | None:
    """The run's DP parameters, None when ``dp_clip`` is 0 (off)."""
    if cfg.dp_clip <= 0:
        return None
    return PrivacySettings(cfg.dp_clip, cfg.dp_noise, cfg.dp_delta, cfg.dp_min_count)


def run_aggregator(cfg: RunConfig, scenario: Scenario) -> Aggregator:
    """The run's aggregation rule, checked against the clients a round samples (the source
    clients times ``fraction``) before any work."""
    aggregator = Aggregator(cfg.aggregator, cfg.aggregator_f, cfg.trim_beta)
    if not aggregator.is_mean:
        sources = sum(1 for c in scenario.clients if c.role == "source")
        sampled = max(1, round(cfg.fraction * sources))
        aggregator.check_clients(sampled, f"{sampled} source clients sampled per round")
    return aggregator


def load_config_dataset(cfg: RunConfig, cache_dir: str | None = None) -> DomainDataset:
    """The run's dataset as its config names it (a broken copy is a DatasetError); under a
    protocol whose scored domains also train (per-domain, personalized), a catalog entry
    whose test split is the whole domain holds out a test part instead (``held_out_test``)."""
    return load_dataset(
        cfg.dataset,
        cache_dir=cache_dir,
        image_size=cfg.image_size or None,
        seed=cfg.split_seed,
        data_root=cfg.data_root or None,
        split_files=cfg.split_files or None,
        catalog_split=cfg.catalog_split,
        held_out_test=get_protocol(cfg.protocol).scores_training_domains,
    )


def prepare(
    cfg: RunConfig, *, cache_dir: str | None = None, dataset: DomainDataset | None = None
) -> Experiment:
    """Load data, build the scenario, algorithm and client contexts; raises on bad input.

    ``dataset`` skips loading ``cfg.dataset`` (tests pass small in-memory datasets).
    """
    numeric_path = set_numeric_path(cfg)  # before the run's first tensor
    device = resolve_device(cfg.device)
    check_compile(cfg, device)
    set_run_threads(cfg.threads)
    if cfg.model_weights:  # a missing weight file is reported before any image is decoded
        weights_file(cfg.model, cfg.model_weights)
    if dataset is None:
        if cfg.problem != "segmentation" and cfg.dataset.split(":")[0] in SEGMENTATION_SETS:
            raise ConfigError(segmentation_only(cfg.dataset.split(":")[0]))
        dataset = load_config_dataset(cfg, cache_dir)
    elif cfg.image_size and cfg.image_size != dataset.image_size:
        dataset = resized(dataset, cfg.image_size)  # as load_dataset resizes a loaded one
    if dataset.meta.get("problem") == "segmentation" and cfg.problem != "segmentation":
        raise ConfigError(segmentation_only(dataset.name))
    algo_cls = REGISTRY[cfg.algorithm]
    scenario = build_scenario(cfg, dataset, pooled=algo_cls.pooled)
    if cfg.problem == "segmentation":
        check_masks([s for c in scenario.clients for s in (c.train, c.val, c.test)], "a client")
    server_data = server_images(cfg, dataset, scenario)
    build = model_builder(cfg, dataset, device=device)
    client_builds = client_model_builders(cfg, dataset, scenario, build, device)
    precision = resolve_precision(cfg.precision, device, cfg.cpu_numerics)
    train_cfg = TrainConfig.of(cfg)
    run = RunInfo(
        num_classes=dataset.num_classes,
        build_model=build,
        train_cfg=train_cfg,
        total_rounds=cfg.rounds,
        seed=cfg.seed,
        device=device,
        problem=cfg.problem,
        aggregator=run_aggregator(cfg, scenario),
        privacy=privacy_settings(cfg),
    )
    algorithm = algo_cls(make_hparams(cfg), run)
    algorithm.check_scenario(scenario)
    augment_name = resolve_augment(cfg.augment, dataset.meta.get("augment", "none"))
    if augment_name != "none" and cfg.problem == "segmentation":
        raise ConfigError(
            f"augment={augment_name} transforms images only and would misalign the "
            "segmentation masks; use augment=none"
        )
    backend = resolve_augment_backend(cfg.augment_backend, device)
    augment = build_augment(augment_name, dataset.image_size, dataset.channels, backend)
    contexts = client_contexts(
        scenario,
        dataset.num_classes,
        client_builds,
        train_cfg,
        device,
        cfg.rounds,
        augment,
        precision,
    )
    inputs = {"augment": augment_name, "normalize": build.template.input_normalization}
    if augment_name == "domainbed":
        inputs["augment_backend"] = backend
    info = run_info(cfg, dataset, scenario, device, inputs)
    info["precision"] = precision.name  # config.json records what auto resolved to
    info["numerics"] = numeric_path  # the CPU's numeric path and machine kind
    info["channels_last"] = uses_channels_last(cfg.channels_last, device, build.template)
    info["compile"] = cfg.compile
    return Experiment(
        cfg, dataset, scenario, algorithm, contexts, device, info, server_data, precision
    )
