"""Resolving a run config: defaults < TOML file < command-line flags < ``--set key=value``.

The plain :class:`~fedshift.core.runconfig.RunConfig` and its registry-free checks live in
:mod:`fedshift.core.runconfig`; this module adds what needs the algorithm and model
registries (which algorithm, which protocols and problems it supports, its hyperparameters).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from fedshift.algorithms import REGISTRY, get_algorithm
from fedshift.core.bounded import check_regular_file, read_toml_bounded
from fedshift.core.errors import ConfigError, did_you_mean
from fedshift.core.hparams import BaseHparams, coerce_hparam
from fedshift.core.hparams import make_hparams as build_hparams
from fedshift.core.runconfig import (
    FIXED,
    KEY_ALIASES,
    RENAMED_KEYS,
    RUN_KEYS,
    RunConfig,
    check_choice,
    check_run_values,
    coerce,
    field_type,
)
from fedshift.core.runfiles import RunFiles, resume_conflict, resume_rule
from fedshift.data.catalog import CATALOG, check_dataset, split_name
from fedshift.data.partitioners import PARTITIONERS
from fedshift.models.registry import is_segmentation, segmentation_models
from fedshift.plugins import is_import_path
from fedshift.presets import Preset, load_preset
from fedshift.scenarios import PROTOCOLS, get_protocol

log = logging.getLogger(__name__)


def renamed(key: str) -> str:
    """The current name of a run key (an old name is accepted with a warning, an alias such as
    ``lambda`` without one)."""
    if key in KEY_ALIASES:
        return KEY_ALIASES[key]
    if key in RENAMED_KEYS:
        log.warning("run key %r is now called %r", key, RENAMED_KEYS[key])
        return RENAMED_KEYS[key]
    return key


#: names other tools give some run keys: a hint for an unknown key
COMMON_NAMES = {
    "learning_rate": "lr",
    "epochs": "local_epochs",
    "num_rounds": "rounds",
    "wd": "weight_decay",
    "algo": "algorithm",
    "method": "algorithm",
    "target_domain": "target",
    "source_domains": "sources",
    "num_clients": "clients_per_domain",
}


def apply_settings(cfg: RunConfig, settings: dict[str, Any]) -> None:
    """Apply flat ``key -> value`` settings (``algo.x`` for algorithm hyperparameters)."""
    for key, value in settings.items():
        if key.startswith("algo."):
            name = key[5:]
            cfg.algo[name] = coerce_hparam(
                REGISTRY[cfg.algorithm].Hparams, name, value, cfg.algorithm
            )
            continue
        key = renamed(key)
        if key in RUN_KEYS:
            setattr(cfg, key, coerce(value, field_type(RunConfig, key), key))
        elif isinstance(value, dict):
            raise ConfigError(
                f"unknown table [{key}] in the config file{did_you_mean(key, ['algo'])}; "
                "the only table is [algo] (the algorithm's hyperparameters)"
            )
        else:
            raise ConfigError(
                f"unknown config key {key!r}{did_you_mean(key, RUN_KEYS, COMMON_NAMES)}; "
                f"valid: {', '.join(RUN_KEYS)}, algo.<hyperparameter>"
            )


def read_toml(path: str | Path) -> dict[str, Any]:
    """Flatten a TOML config (top-level run keys and an ``[algo]`` table)."""
    path = check_regular_file(path, "config file", ConfigError)
    data = read_toml_bounded(path, ConfigError)
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
    """Checks that need no data: the algorithm, its protocols and problems, choices, ranges."""
    get_algorithm(cfg.algorithm)  # built-in, registered or plug-in; ConfigError if none
    get_protocol(cfg.protocol)
    check_choice("partition", cfg.partition, PARTITIONERS)
    check_run_values(cfg)
    algorithm = REGISTRY[cfg.algorithm]
    supported = algorithm.protocols
    if supported and cfg.protocol not in supported:
        raise ConfigError(
            f"algorithm {cfg.algorithm!r} does not run in protocol {cfg.protocol!r}; "
            f"supported: {', '.join(supported)} (use --protocol {supported[0]})"
        )
    check_problem(cfg, algorithm)
    if cfg.model_selection == "algorithm" and not algorithm.selection:
        raise ConfigError(
            f"model_selection=algorithm: {cfg.algorithm!r} has no label-free selection score "
            "(FACT and FACT-NF select by min IDD); use model_selection=source-val"
        )
    if cfg.dp_clip > 0 and not algorithm.private:
        ready = sorted(name for name, cls in REGISTRY.items() if cls.private)
        raise ConfigError(
            f"algorithm {cfg.algorithm!r} shares {', '.join(sorted(algorithm.shares)) or 'nothing'}"
            f", which differential privacy (dp_clip) does not cover; it runs with: "
            f"{', '.join(ready)}"
        )
    if cfg.dp_clip > 0 and cfg.aggregator != "mean":
        raise ConfigError(
            f"dp_clip replaces the mean by DP's clipped, noisy mean and cannot be combined with "
            f"aggregator={cfg.aggregator}; choose one"
        )
    if cfg.dp_clip > 0 and importlib.util.find_spec("opacus") is None:
        raise ConfigError(
            "dp_clip needs Opacus for its privacy accountant: pip install 'fedshift[privacy]'"
        )


def check_problem(cfg: RunConfig, algorithm: type) -> None:
    """The learning problem must be supported by the algorithm and fit the model."""
    supported = algorithm.supported_problems()
    if cfg.problem not in supported:
        raise ConfigError(
            f"algorithm {cfg.algorithm!r} does not support problem {cfg.problem!r}; "
            f"supported: {', '.join(supported)}"
        )
    if cfg.problem == "segmentation" and not is_segmentation(cfg.model):
        raise ConfigError(
            f"problem 'segmentation' needs a segmentation model "
            f"({', '.join(segmentation_models())}), got {cfg.model!r}; use --model unet"
        )
    if cfg.problem == "classification" and is_segmentation(cfg.model):
        raise ConfigError(f"model {cfg.model!r} segments images; use it with problem=segmentation")


#: run keys whose value may be an import path ``package.module:attribute`` (code is imported)
IMPORT_KEYS = ("algorithm", "model")
#: the environment variable that lets files (presets, ``--config``, a saved config.json) name
#: import paths, as ``--allow-imports`` does
ALLOW_IMPORTS_ENV = "FEDSHIFT_ALLOW_IMPORTS"


def imports_allowed(allow_imports: bool = False) -> bool:
    """Whether files may name import paths: ``--allow-imports`` or ``FEDSHIFT_ALLOW_IMPORTS=1``."""
    return allow_imports or os.environ.get(ALLOW_IMPORTS_ENV, "") not in ("", "0")


def _import_key(key: str) -> str:
    """The run key ``key`` stands for (old names and aliases), without a warning."""
    return KEY_ALIASES.get(key, RENAMED_KEYS.get(key, key))


def refuse_file_imports(
    settings: dict[str, Any], given_later: set[str], where: str, *, rebuild: bool = False
) -> None:
    """A ConfigError when ``settings`` read from a file (``where``) name an import path for a
    key that imports code and that no later layer (``given_later``) overrides: a file a user
    was sent must not run code; the command line or the opt-in may. ``rebuild``: the file
    is a saved run rebuilt as it was (``plot tsne``), which only the opt-in can allow."""
    for key, value in settings.items():
        key = _import_key(key)
        if key in IMPORT_KEYS and key not in given_later and isinstance(value, str):
            if is_import_path(value):
                how = "" if rebuild else f"give --{key} {value} on the command line, or "
                raise ConfigError(
                    f"{where} sets {key}={value!r}, an import path, and files may not import "
                    f"code; {how}allow it with --allow-imports or {ALLOW_IMPORTS_ENV}=1"
                    + (" if you trust that run folder" if rebuild else "")
                )


def resolve(
    file: str | None, flags: dict[str, Any], sets: list[str], *, allow_imports: bool = False
) -> RunConfig:
    """Defaults < preset < TOML file < flags < --set; unknown keys and bad values raise
    ConfigError. A ``preset`` key (``--preset``) given at any of those levels brings in the
    preset's settings as the lowest layer (see :func:`with_preset`). An import path for
    ``algorithm`` or ``model`` may come from ``flags`` and ``sets`` (the command line or the
    Python API), from the file or the preset only with ``allow_imports`` (or
    ``FEDSHIFT_ALLOW_IMPORTS=1``)."""
    allowed = imports_allowed(allow_imports)
    settings: dict[str, Any] = {}
    command_line = {k: v for k, v in flags.items() if v is not None}
    command_line.update(parse_set(sets))
    given = {_import_key(k) for k in command_line}
    if file:
        settings.update(read_toml(file))
        if not allowed:
            refuse_file_imports(settings, given, f"config file {file}")
    settings.update(command_line)
    preset = load_preset(str(settings["preset"])) if settings.get("preset") else None
    if preset is not None:
        if not allowed:  # the preset's own settings are checked too, whatever overrides them
            refuse_file_imports(preset.settings, set(), f"preset file {preset.path}")
        settings = with_preset(preset, settings)
    cfg = _resolve_settings(settings)
    cfg.preset_sha256 = preset.sha256 if preset is not None else ""
    if preset is not None:
        check_preset_data(cfg)
    return cfg


def with_preset(preset: Preset, settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` over the (checked) preset's, with the preset's name recorded. The preset's
    ``[algo]`` table is left out when ``settings`` choose another algorithm."""
    check_preset(preset)
    base = dict(preset.settings)
    given = settings.get("algorithm")
    if given is not None and given != preset.algorithm:
        base = {k: v for k, v in base.items() if not k.startswith("algo.")}
    return {**base, **settings, "preset": preset.name}


def check_preset(preset: Preset) -> RunConfig:
    """The preset's own settings resolved and checked (run keys, values, the algorithm's
    hyperparameters); a ConfigError names the preset file."""
    try:
        return _resolve_settings(dict(preset.settings))
    except ConfigError as exc:
        raise ConfigError(f"preset file {preset.path}: {exc}") from None


def check_preset_data(cfg: RunConfig) -> None:
    """A preset on a catalog dataset needs ``data_root`` holding a sound copy: the check of
    ``fedshift datasets check`` runs first, and its one-line error stops the run."""
    name, domains = split_name(cfg.dataset)
    if name not in CATALOG:
        return
    if not cfg.data_root:
        raise ConfigError(
            f"preset {cfg.preset} reads dataset {name!r} from your copy: give --set "
            f"data_root=PATH (check it with `fedshift datasets check {cfg.dataset} --root PATH`)"
        )
    check_dataset(name, cfg.data_root, domains)


def _resolve_settings(settings: dict[str, Any]) -> RunConfig:
    """Flat settings (run keys, ``algo.NAME``) over the defaults, resolved and checked."""
    cfg = RunConfig()
    run_settings = {renamed(k): v for k, v in settings.items() if not k.startswith("algo.")}
    apply_settings(cfg, run_settings)
    protocol = PROTOCOLS.get(cfg.protocol)  # an unknown name fails in validate()
    if protocol and protocol.default_target is not None and "target" not in run_settings:
        cfg.target = protocol.default_target
    if "model" not in run_settings and cfg.algorithm in REGISTRY:
        cfg.model = REGISTRY[cfg.algorithm].default_model or cfg.model
    validate(cfg)
    apply_settings(cfg, {k: v for k, v in settings.items() if k.startswith("algo.")})
    cfg.algo = dataclasses.asdict(make_hparams(cfg))
    return cfg


def saved_run_config(run_dir: str | Path) -> dict[str, Any]:
    """The config a run directory was started with: its ``config.json``, else its checkpoint's."""
    return RunFiles(run_dir).saved_config()


def rebuild_config(run_dir: str | Path, *, allow_imports: bool = False) -> RunConfig:
    """The config a run directory was started with, as a RunConfig to rebuild its model and
    algorithm from (``fedshift plot tsne``, :func:`fedshift.report.tsne.load_run`): the one
    rule for code named by a file, the refusal of ``--resume``. A saved import path
    (``algorithm`` or ``model``) is a one-line ConfigError, nothing imported, unless allowed
    (``allow_imports`` or ``FEDSHIFT_ALLOW_IMPORTS=1``); keys this version does not know
    (a newer fedshift's) are left out."""
    saved = saved_run_config(run_dir)
    if not imports_allowed(allow_imports):
        where = f"the saved config of the run in {run_dir}"
        refuse_file_imports(saved, set(), where, rebuild=True)
    names = {f.name for f in dataclasses.fields(RunConfig)}
    saved = {RENAMED_KEYS.get(k, k): v for k, v in saved.items()}
    return RunConfig(**{k: v for k, v in saved.items() if k in names})


def resolve_resume(
    run_dir: str | Path,
    file: str | None,
    flags: dict[str, Any],
    sets: list[str],
    *,
    allow_imports: bool = False,
) -> RunConfig:
    """The config of the run in ``run_dir``, so ``--resume`` needs no repeated flags.

    Settings given anyway (file, flags, ``--set``) must agree with the saved ones as each key's
    resume rule says (:func:`fedshift.core.runfiles.resume_conflict`: ``device``, ``threads``
    and ``tracking`` may change, ``rounds`` may grow, which extends a finished run); a
    contradiction is a ConfigError naming the key. A run started with ``threads=0`` continues
    with the thread count it used (``run_info.threads``), a run from before ``cpu_numerics``
    on the native path it ran on. A saved import path (``algorithm`` or
    ``model``) must be given again on the command line, or allowed (``allow_imports``).
    """
    saved = saved_run_config(run_dir)
    command_line = {k: v for k, v in flags.items() if v is not None}
    command_line.update(parse_set(sets))
    allowed = imports_allowed(allow_imports)
    if not allowed:
        where = f"the saved config of the run in {run_dir}"
        refuse_file_imports(saved, {_import_key(k) for k in command_line}, where)
    cfg = RunConfig()
    apply_settings(cfg, {k: v for k, v in saved.items() if k not in ("run_info", "algo")})
    if "cpu_numerics" not in saved:
        cfg.cpu_numerics = "native"  # a run from before the pinned path ran on the native one
    cfg.algo = dict(saved.get("algo") or {})
    settings: dict[str, Any] = {}
    if file:
        settings.update(read_toml(file))
        if not allowed:
            refuse_file_imports(settings, set(command_line), f"config file {file}")
    settings.update(command_line)
    settings = {renamed(k): v for k, v in settings.items()}
    given = RunConfig(algorithm=cfg.algorithm, algo=dict(cfg.algo))
    apply_settings(given, {k: v for k, v in settings.items() if not k.startswith("algo.")})
    check_unchanged(run_dir, cfg, given, [k for k in settings if not k.startswith("algo.")])
    apply_settings(given, {k: v for k, v in settings.items() if k.startswith("algo.")})
    check_unchanged(run_dir, cfg, given, [k for k in settings if k.startswith("algo.")])
    for key in settings:
        if not key.startswith("algo.") and resume_rule(key) != FIXED:
            setattr(cfg, key, getattr(given, key))
    threads_used = (saved.get("run_info") or {}).get("threads")
    if cfg.threads == 0 and "threads" not in settings and isinstance(threads_used, int):
        cfg.threads = max(1, threads_used)  # the count threads=0 chose: the same numbers
    validate(cfg)
    cfg.algo = dataclasses.asdict(make_hparams(cfg))
    return cfg


def check_unchanged(run_dir: str | Path, saved: RunConfig, given: RunConfig, keys) -> None:
    """Refuse a resume setting that contradicts the saved run (see :func:`resolve_resume`)."""
    for name in keys:
        if name.startswith("algo."):
            before, after = saved.algo.get(name[5:]), given.algo.get(name[5:])
        else:
            before, after = getattr(saved, name), getattr(given, name)
        verb = resume_conflict(name, before, after)
        if not verb:
            continue
        raise ConfigError(
            f"{verb} {name} of the run in {run_dir} on --resume (saved {before!r}, given "
            f"{after!r}); leave it out to continue the run, or start a new run with another --out"
        )


def make_hparams(cfg: RunConfig) -> BaseHparams:
    """The run's algorithm hyperparameters, built and range-checked."""
    return build_hparams(REGISTRY[cfg.algorithm].Hparams, cfg.algo, cfg.algorithm)
