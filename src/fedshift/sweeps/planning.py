"""Planning a sweep: algorithms × targets × seeds × a hyperparameter grid or a seeded random
search, every run resolved by :func:`fedshift.config.resolve` before the first one starts."""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
from pathlib import Path
from typing import Any

from fedshift.algorithms import REGISTRY, get_algorithm, origin_of
from fedshift.config import parse_set, renamed, resolve
from fedshift.core.errors import ConfigError, did_you_mean
from fedshift.core.hparams import hparam_types
from fedshift.core.runconfig import RunConfig, check_choice_device
from fedshift.data.custom import registered_datasets
from fedshift.engine.compute import resolve_device
from fedshift.sweeps.random_search import random_points, searched_keys

#: run keys a sweep takes from its own options, not from ``--grid``
SWEEP_OPTIONS = {"algorithm": "-a/--algorithms", "target": "-t/--targets", "seed": "--seeds"}


#: characters kept as they are when a grid value becomes part of a directory name
UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9._=+:-]")


@dataclasses.dataclass(frozen=True)
class PlannedRun:
    """One run of a sweep: its resolved config, run directory and grid point."""

    cfg: RunConfig
    run_dir: Path
    #: grid key -> the resolved value of this run (empty without a grid)
    grid: dict[str, Any]
    #: read a summary found under the lock (False: the sweep found it half-written already)
    read_back: bool = True

    @property
    def name(self) -> str:
        return self.run_dir.name


def parse_grid(items: list[str] | dict[str, Any] | None) -> dict[str, list[Any]]:
    """``--grid KEY=v1,v2`` items (or a ``{key: [values]}`` dict) as ``{key: [values]}``.

    Keys are checked against the sweep's own options and each other here; whether each key
    and value is valid is checked by :func:`plan`, through the run config's resolver.
    """
    if not items:
        return {}
    if isinstance(items, dict):
        pairs = [(k, list(v) if isinstance(v, list | tuple) else [v]) for k, v in items.items()]
    else:
        pairs = []
        for item in items:
            key, sep, values = item.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"--grid expects KEY=v1,v2,..., got {item!r}")
            pairs.append((key.strip(), [v.strip() for v in values.split(",") if v.strip()]))
    grid: dict[str, list[Any]] = {}
    for key, values in pairs:
        key = key if key.startswith("algo.") else renamed(key)
        if key in SWEEP_OPTIONS:
            raise ConfigError(
                f"--grid {key}: sweep {key}s with {SWEEP_OPTIONS[key]}, not with --grid"
            )
        if key in grid:
            raise ConfigError(f"--grid {key} is given twice; give its values once, comma-separated")
        if not values:
            raise ConfigError(f"--grid {key} has no values; give KEY=v1,v2,...")
        grid[key] = values
    return grid


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the grid's values (one empty point without a grid)."""
    keys = list(grid)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*grid.values())]


def applicable(point: dict[str, Any], algorithm: str, grid_keys_known: set[str]) -> dict:
    """The part of a grid point that applies to ``algorithm``: an ``algo.NAME`` key that
    the algorithm has no hyperparameter for is left out when another algorithm of the sweep
    has it (``--grid algo.mu=...`` with ``-a fedavg,fedprox`` varies FedProx only)."""
    names = set(hparam_types(REGISTRY[algorithm].Hparams))
    return {
        k: v
        for k, v in point.items()
        if not k.startswith("algo.") or k[5:] in names or k not in grid_keys_known
    }


def resolved_value(cfg: RunConfig, key: str) -> Any:
    """The value of a grid key in a resolved config (``algo.NAME`` or a run key)."""
    return cfg.algo[key[5:]] if key.startswith("algo.") else getattr(cfg, key)


def value_text(value: Any) -> str:
    """A resolved value as it appears in a run directory's name (``0.01``, ``1e-05``)."""
    text = repr(value) if isinstance(value, float) else str(value)
    return UNSAFE_IN_NAME.sub("_", text)


def run_name(algorithm: str, target: str, seed: int, point: dict[str, Any]) -> str:
    """``fedprox-mnistm-s0`` without a grid (the names of sweeps before grids), else
    ``fedprox-mnistm-s0@algo.mu=0.01,lr=0.05`` (grid keys sorted, resolved values)."""
    base = f"{algorithm}-{target}-s{seed}"
    if not point:
        return base
    return base + "@" + ",".join(f"{k}={value_text(point[k])}" for k in sorted(point))


def check_devices(devices: list[str]) -> list[str]:
    """``--devices`` names, each a valid and present device (``cpu``, ``cuda``, ``cuda:N``)."""
    for device in devices:
        check_choice_device(device)
        resolve_device(device)  # ConfigError when CUDA or that GPU is missing
    return list(devices)


def plan(
    algorithms: list[str],
    targets: list[str],
    seeds: list[int],
    out: str | Path,
    *,
    config_file: str | None = None,
    flags: dict[str, Any] | None = None,
    sets: list[str] | None = None,
    grid: dict[str, list[Any]] | list[str] | None = None,
    devices: list[str] | None = None,
    jobs: int = 1,
    random_trials: int = 0,
    random_seed: int = 0,
) -> list[PlannedRun]:
    """Every run of the sweep, resolved and checked (ConfigError before any work).

    Grid values override ``flags``; a grid key also given in ``sets`` (``--set``) or as a
    flag is an error, as is a grid point no algorithm of the sweep uses. ``random_trials`` >
    0 replaces the grid by a seeded random search (:mod:`fedshift.sweeps.random_search`):
    that many points per algorithm, crossed with targets × seeds; a key fixed by a flag or
    ``--set`` is not drawn. ``devices`` are given round-robin in plan order. With ``jobs`` >
    1 a run whose ``threads`` is unset gets ``max(1, cores // jobs)`` CPU threads, so
    parallel runs do not oversubscribe the cores.
    """
    out = Path(out).absolute()
    grid = parse_grid(grid)
    if random_trials < 0:
        raise ConfigError(f"--random must be at least 1, got {random_trials}")
    if random_trials and grid:
        raise ConfigError("give --grid or --random, not both")
    flags = {k if k.startswith("algo.") else renamed(k): v for k, v in (flags or {}).items()}
    given = {k if k.startswith("algo.") else renamed(k) for k in parse_set(list(sets or []))}
    given |= {k for k, v in flags.items() if v is not None}
    for key in grid:
        if key in given:
            raise ConfigError(f"{key} is given both in --grid and as a fixed setting; keep one")
    if devices and "device" in grid:
        raise ConfigError("device is given both in --grid and --devices; keep one")
    devices = check_devices(devices) if devices else []
    for algorithm in algorithms:
        get_algorithm(algorithm)  # unknown name: ConfigError with did-you-mean
    known = {
        k
        for k in grid
        if k.startswith("algo.")
        and any(k[5:] in hparam_types(REGISTRY[a].Hparams) for a in algorithms)
    }
    for key in grid:
        if key.startswith("algo.") and key not in known:
            names = sorted({n for a in algorithms for n in hparam_types(REGISTRY[a].Hparams)})
            raise ConfigError(
                f"--grid {key}: no algorithm of the sweep ({', '.join(algorithms)}) has "
                f"hyperparameter {key[5:]!r}{did_you_mean(key[5:], names)}; theirs: "
                f"{', '.join(f'algo.{n}' for n in names) or '(none)'}"
            )
    threads = max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else 0
    planned: list[PlannedRun] = []
    names: dict[str, dict[str, Any]] = {}
    for algorithm in algorithms:
        if random_trials:
            recorded = list(searched_keys(algorithm, given))
            points = random_points(algorithm, random_trials, random_seed, given)
        else:
            recorded = []
            points = [applicable(point, algorithm, known) for point in grid_points(grid)]
        for target in targets:
            for seed in seeds:
                for point in points:
                    settings = {**flags, **point, "algorithm": algorithm}
                    settings.update(target=target, seed=seed)
                    cfg = resolve(config_file, settings, list(sets or []))
                    values = {k: resolved_value(cfg, k) for k in recorded or point}
                    name = run_name(algorithm, target, seed, values)
                    if name in names:
                        if names[name] != cfg.to_dict():
                            raise ConfigError(
                                f"two grid points of the sweep both name run {name}; "
                                "give grid values that differ once written in a folder name"
                            )
                        continue  # the same run again (a grid key this algorithm lacks)
                    names[name] = cfg.to_dict()
                    if devices:
                        cfg = dataclasses.replace(cfg, device=devices[len(planned) % len(devices)])
                    if threads and cfg.threads == 0:
                        cfg = dataclasses.replace(cfg, threads=threads)
                    planned.append(PlannedRun(cfg, out / name, values))
    return planned


def check_picklable(runs: list[PlannedRun]) -> None:
    """Worker processes import fedshift afresh: an algorithm registered in this process only
    (``fedshift.register_algorithm``) does not exist there."""
    for algorithm in {run.cfg.algorithm for run in runs}:
        if origin_of(algorithm) == "registered":
            raise ConfigError(
                f"algorithm {algorithm!r} was registered in this process, which parallel "
                "runs (--jobs > 1, --backend ray) cannot see: use jobs=1, or make it a "
                "plug-in (package.module:Class)"
            )
    for dataset in {run.cfg.dataset for run in runs}:
        if dataset in registered_datasets():
            raise ConfigError(
                f"dataset {dataset!r} was registered in this process, which parallel runs "
                "(--jobs > 1, --backend ray) cannot see: use jobs=1, a dataset folder, or a "
                "dataset plug-in"
            )
