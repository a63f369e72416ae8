"""The public Python API: what the command line does, from a script, with the same errors.

    import fedshift
    result = fedshift.run(algorithm="fedprox", target="mnistm", rounds=5, algo={"mu": 0.1})
    print(result.summary["target_accuracy"], result.history[-1])

Run keys are those of ``fedshift run --set KEY=VALUE`` (``fedshift.config.RUN_KEYS``);
algorithm hyperparameters go in ``algo={...}`` (or as ``**{"algo.mu": 0.1}``). Keys are
resolved and checked by :func:`fedshift.config.resolve`, the code path of the CLI, so a bad
key or value raises the same :class:`~fedshift.core.errors.ConfigError` (with the same
message) that the CLI prints as ``fedshift: error: ...``. A paper preset is the run key
``preset`` (``fedshift.run(preset="fedsr-pacs", data_root="/data/PACS", rounds=5)``): its
settings lie below the other keys; :func:`load_preset` reads one, :func:`preset_names`
lists the shipped ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedshift.algorithms import register_algorithm
from fedshift.config import resolve, resolve_resume
from fedshift.core.errors import CheckpointError, ConfigError
from fedshift.core.runconfig import RunConfig
from fedshift.core.runfiles import CONFIG, RunFiles, load_json_object
from fedshift.data.custom import make_dataset, register_dataset
from fedshift.data.domains import DomainDataset
from fedshift.engine.assembly import prepare
from fedshift.engine.run.runner import run_experiment
from fedshift.models.registry import register_model
from fedshift.presets import Preset, load_preset, preset_names
from fedshift.sweeps import SweepFailed
from fedshift.sweeps import sweep as run_sweep

__all__ = [
    "Preset",
    "RunResult",
    "SweepFailed",
    "Task",
    "load_preset",
    "load_run",
    "plan",
    "preset_names",
    "register_algorithm",
    "register_dataset",
    "register_model",
    "run",
    "sweep",
]


@dataclass(frozen=True)
class RunResult:
    """A finished (or stopped) run: its summary, per-round history, directory and config."""

    #: ``summary.json``: final and selected accuracies, bytes, timings (empty if unfinished)
    summary: dict[str, Any]
    #: the rows of ``metrics.jsonl``, one dict per logged round
    history: list[dict[str, Any]]
    run_dir: Path
    #: ``config.json``: the resolved run keys, ``algo`` and ``run_info`` (clients, versions)
    config: dict[str, Any]

    @property
    def finished(self) -> bool:
        return bool(self.summary)

    def metric(self, key: str) -> list[Any]:
        """One metric per logged round (rounds that did not log it are left out)."""
        return [row[key] for row in self.history if key in row]


@dataclass(frozen=True)
class Task:
    """What a run would do, without training: the resolved config and its clients."""

    config: RunConfig
    #: one dict per client: id, name, domain, role (source/target) and split sizes
    clients: list[dict[str, Any]]
    sources: list[str]
    targets: list[str]
    info: dict[str, Any] = field(repr=False, default_factory=dict)


def _settings(keys: dict[str, Any]) -> dict[str, Any]:
    """Run keys and ``algo={...}`` flattened as the CLI's flags (``algo.NAME``)."""
    settings = {k: v for k, v in keys.items() if k != "algo"}
    algo = keys.get("algo") or {}
    if not isinstance(algo, dict):
        raise ConfigError(f"algo must be a dict of hyperparameters, got {type(algo).__name__}")
    settings.update({f"algo.{k}": v for k, v in algo.items()})
    return settings


def _with_dataset(keys: dict[str, Any]) -> tuple[dict[str, Any], DomainDataset | None]:
    """An in-memory ``dataset=`` (DomainDataset or ``{domain: data}``) taken out of ``keys``."""
    data = keys.get("dataset")
    if data is None or isinstance(data, str | Path):
        return keys, None
    dataset = make_dataset(data, name="custom" if not isinstance(data, DomainDataset) else "")
    return {**keys, "dataset": dataset.name}, dataset


def resolve_keys(config: str | Path | None = None, **keys: Any) -> RunConfig:
    """The resolved, checked run config of ``keys`` (defaults < ``config`` TOML < keys)."""
    return resolve(str(config) if config else None, _settings(keys), [])


def run(
    *,
    config: str | Path | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    force_data: bool = False,
    progress: bool = False,
    **keys: Any,
) -> RunResult:
    """Run one experiment, as ``fedshift run``; returns its :class:`RunResult`.

    Args:
        config: a TOML file of run keys and an ``[algo]`` table (as ``--config``).
        out: run directory (default ``runs/<algo>-<dataset>-<target>-s<seed>``).
        resume: continue the run in ``out`` (its saved config; ``rounds`` may grow).
        force_data: with ``resume``, continue even though a domain's data changed since
            the run started (as ``--force-data``).
        progress: show the progress bar.
        **keys: run keys (``algorithm``, ``target``, ``rounds``, ``lr``, ...) and
            ``algo={...}``. ``dataset`` may also be a DomainDataset or ``{domain: data}``
            (see :func:`fedshift.data.make_dataset`), used in memory.

    Raises:
        ConfigError, DatasetError, CheckpointError, RoundFailed, StorageError: as the CLI.
    """
    keys, dataset = _with_dataset(keys)
    if resume:
        if out is None:
            raise ConfigError("resume=True needs out=RUN_DIR (the run to continue)")
        cfg = resolve_resume(out, str(config) if config else None, _settings(keys), [])
    else:
        cfg = resolve_keys(config, **keys)
    _, run_dir = run_experiment(
        cfg, out, resume=resume, progress=progress, dataset=dataset, force_data=force_data
    )
    return load_run(run_dir)


def plan(*, config: str | Path | None = None, **keys: Any) -> Task:
    """What :func:`run` would do (``fedshift run --dry-run``): data loaded, clients built,
    nothing trained or written."""
    keys, dataset = _with_dataset(keys)
    cfg = resolve_keys(config, **keys)
    exp = prepare(cfg, dataset=dataset)
    info = exp.info
    return Task(cfg, list(info["clients"]), list(info["sources"]), list(info["targets"]), info)


def sweep(
    out: str | Path,
    *,
    algorithms: list[str],
    targets: list[str],
    seeds: list[int] = (0,),
    config: str | Path | None = None,
    grid: dict[str, list[Any]] | None = None,
    jobs: int | None = None,
    devices: list[str] | None = None,
    backend: str = "local",
    progress: bool = False,
    random_trials: int = 0,
    random_seed: int = 0,
    **keys: Any,
) -> list[RunResult]:
    """Run every combination into ``out`` as ``fedshift sweep`` (resumable: finished runs are
    read back); one :class:`RunResult` per run, in plan order.

    Args:
        grid: ``{"algo.mu": [0.001, 0.01], "lr": [0.01, 0.05]}``: every combination is
            crossed with algorithms × targets × seeds (as ``--grid``); an ``algo.NAME`` key
            applies to the algorithms that have that hyperparameter.
        random_trials: instead of ``grid``, a seeded random search of that many points per
            algorithm (as ``--random N``; the first point its defaults).
        random_seed: the random search's seed (``--random-seed``).
        jobs: runs at once (spawned worker processes; 1 runs them in this process).
        devices: given to the runs round-robin, e.g. ``["cuda:0", "cuda:1"]``.
        backend: a name of :data:`fedshift.sweeps.launchers.LAUNCHERS`: ``"local"`` or
            ``"ray"`` (each run a Ray task; needs ``fedshift[ray]``).
        **keys: run keys applied to every run (``algo={...}`` too).

    Raises:
        ConfigError: a bad name, key or value, before any run.
        SweepFailed: after the sweep, when some runs failed; ``.results`` holds the others.
    """
    flags = _settings(keys)
    summaries = run_sweep(
        list(algorithms),
        list(targets),
        [int(s) for s in seeds],
        out,
        config_file=str(config) if config else None,
        flags=flags,
        grid=grid,
        jobs=jobs,
        devices=list(devices) if devices else None,
        backend=backend,
        progress=progress,
        random_trials=random_trials,
        random_seed=random_seed,
    )
    results = [load_run(run_dir) for run_dir in summaries.run_dirs]
    if summaries.failed:
        raise SweepFailed(summaries.failed, results)
    return results


def load_run(run_dir: str | Path) -> RunResult:
    """A run directory as a :class:`RunResult`; an unfinished run has an empty summary.

    Raises CheckpointError when ``run_dir`` holds no fedshift run (no ``config.json``).
    """
    run_dir = Path(run_dir)
    files = RunFiles(run_dir)
    if not files.config.is_file():
        raise CheckpointError(f"{run_dir} is not a fedshift run directory (no {CONFIG})")
    config = load_json_object(files.config)
    summary = load_json_object(files.summary) if files.summary.is_file() else {}
    return RunResult(summary=summary, history=files.history(), run_dir=run_dir, config=config)
