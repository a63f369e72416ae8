"""Per-round curves from run directories: one line per configuration, mean ± std over seeds.

Runs are grouped by their config (``config.json``) minus the seed and the settings that
do not change what is learned (device, threads, tracking, ...: the tables' rule,
:data:`fedshift.report.experiments.NOT_EXPERIMENT`): runs that differ only in the
seed share a line, the mean over them with a ±1 std band (the sample std, as the tables
use). The legend names each group by algorithm and target, plus every other key that
differs between the groups (``lr=0.1``).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedshift.core.bounded import parse_json, read_json_bounded
from fedshift.core.errors import ConfigError, did_you_mean
from fedshift.core.outputs import FIGURE, check_output, write_figure
from fedshift.core.runfiles import CONFIG, METRICS, SUMMARY_KEYS, RunFiles, run_dirs_with_metrics
from fedshift.engine.run.tracking import flatten
from fedshift.report.aggregate import is_fraction
from fedshift.report.experiments import NOT_EXPERIMENT

#: config keys that never split runs into groups: the seed is what the band is over, the
#: others change where and how fast a run goes, not what it learns (the tables' rule)
NOT_GROUPED = NOT_EXPERIMENT
#: summary figures derived from a per-round metric: ``target_accuracy_last`` -> its curve
SUMMARY_SUFFIXES = ("_last", "_oracle")


@dataclass
class RunCurves:
    """One run directory: its config (flat) and its metrics.jsonl lines (flat)."""

    run_dir: Path
    config: dict[str, Any]
    rounds: list[dict[str, Any]]


@dataclass
class Group:
    """The runs of one configuration and their mean ± std per round."""

    label: str
    runs: list[Path]
    rounds: list[int] = field(default_factory=list)
    mean: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)


def find_run_dirs(paths: list[str | Path]) -> list[Path]:
    """Every run directory (one holding metrics.jsonl) in or under ``paths``, in order."""
    found: list[Path] = []
    for root in map(Path, paths):
        if not root.is_dir():
            raise ConfigError(f"{root} is not a folder (give run directories or their parents)")
        dirs = run_dirs_with_metrics(root)
        if not dirs:
            raise ConfigError(f"no run directory ({METRICS}) in {root}")
        found += [d for d in dirs if d not in found]
    return found


def read_run(run_dir: Path) -> RunCurves:
    """A run's flattened config (``config.json``, else the algorithm, target and seed its
    ``summary.json`` names) and metrics lines; a broken file is a one-line error."""
    try:
        files = RunFiles(run_dir)
        lines = files.metric_lines()
        config_file = files.config
        if not config_file.exists() and files.summary.exists():
            config_file = files.summary
        if not config_file.exists():
            raise FileNotFoundError(2, "missing", str(config_file))
        config = read_json_bounded(config_file, ConfigError)
        if config_file == files.summary and isinstance(config, dict):
            config = {k: config.get(k) for k in SUMMARY_KEYS}
        rounds = [flatten(parse_json(line, ConfigError, str(files.metrics))) for line in lines]
    except FileNotFoundError as exc:
        missing = Path(exc.filename or CONFIG).name
        raise ConfigError(f"{run_dir} is not a run directory (no {missing})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read the run in {run_dir}: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{RunFiles(run_dir).config} is not a fedshift run config")
    return RunCurves(run_dir, flatten(config), rounds)


def round_metrics(runs: list[RunCurves]) -> list[str]:
    """The numeric per-round metrics the runs logged (``round`` aside), sorted."""
    return sorted(
        {
            key
            for run in runs
            for line in run.rounds
            for key, value in line.items()
            if key != "round" and isinstance(value, int | float)
        }
    )


def curve_metric(metric: str, available: list[str]) -> str:
    """The per-round metric to draw for ``metric``: itself, or the per-round metric a
    summary figure is taken from (``target_accuracy_last`` -> ``target_accuracy``)."""
    if metric in available:
        return metric
    for suffix in SUMMARY_SUFFIXES:
        if metric.endswith(suffix) and metric.removesuffix(suffix) in available:
            return metric.removesuffix(suffix)
    raise ConfigError(
        f"unknown per-round metric {metric!r}{did_you_mean(metric, available)}; "
        f"the runs' metrics.jsonl have: {', '.join(available)}"
    )


def group_runs(runs: list[RunCurves]) -> list[tuple[str, list[RunCurves]]]:
    """Runs grouped by the config keys they all have (seed and ``NOT_GROUPED`` aside), in
    first-seen order, each labelled ``algorithm -> target`` plus the keys that tell it apart."""
    # keys every run has (a run of an older version, or known only by its summary, lacks some)
    shared = set.intersection(*(set(run.config) for run in runs)) if runs else set()
    keys = sorted(shared - set(NOT_GROUPED))
    differing = [
        k
        for k in keys
        if k not in ("algorithm", "target")
        and len({json.dumps(run.config.get(k), sort_keys=True) for run in runs}) > 1
    ]
    groups: dict[str, list[RunCurves]] = {}
    labels: dict[str, str] = {}
    for run in runs:
        identity = json.dumps({k: run.config.get(k) for k in keys}, sort_keys=True)
        groups.setdefault(identity, []).append(run)
        extra = ", ".join(f"{k}={run.config.get(k)}" for k in differing)
        label = f"{run.config.get('algorithm', '?')} → {run.config.get('target', '?')}"
        labels[identity] = f"{label} ({extra})" if extra else label
    return [(labels[identity], members) for identity, members in groups.items()]


def curve_groups(run_dirs: list[str | Path], metric: str) -> tuple[str, list[Group]]:
    """The per-round metric drawn for ``metric`` and each group's mean ± std per round
    (over the group's runs that logged that round)."""
    runs = [read_run(Path(d)) for d in run_dirs]
    if not runs:
        raise ConfigError("no run directory to plot")
    metric = curve_metric(metric, round_metrics(runs))
    groups = []
    for label, members in group_runs(runs):
        group = Group(label, [run.run_dir for run in members])
        by_round: dict[int, list[float]] = {}
        for run in members:
            for line in run.rounds:
                value = line.get(metric)
                if isinstance(value, int | float) and math.isfinite(value):
                    by_round.setdefault(int(line["round"]), []).append(float(value))
        for round_ in sorted(by_round):
            values = by_round[round_]
            group.rounds.append(round_)
            group.mean.append(statistics.fmean(values))
            group.std.append(statistics.stdev(values) if len(values) > 1 else 0.0)
        groups.append(group)
    return metric, groups


def draw_curves(groups: list[Group], metric: str):
    """The figure: one line per group (tab10 colours, then other dash styles), its ±1 std
    band shaded, whole-number round ticks; accuracies and Dice in %."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    scale = 100.0 if is_fraction(metric) else 1.0
    colours = plt.get_cmap("tab10").colors
    styles = ("-", "--", ":", "-.")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for index, group in enumerate(groups):
        if not group.rounds:
            continue
        colour = colours[index % len(colours)]
        mean = [scale * m for m in group.mean]
        low = [scale * (m - s) for m, s in zip(group.mean, group.std, strict=True)]
        high = [scale * (m + s) for m, s in zip(group.mean, group.std, strict=True)]
        seeds = len(group.runs)
        ax.plot(
            group.rounds,
            mean,
            color=colour,
            linestyle=styles[(index // len(colours)) % len(styles)],
            marker="o" if len(group.rounds) == 1 else None,
            label=f"{group.label}, {seeds} run{'s' if seeds > 1 else ''}",
        )
        if seeds > 1:
            ax.fill_between(group.rounds, low, high, color=colour, alpha=0.2, linewidth=0)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")
    ax.set_ylabel(f"{metric} (%)" if scale != 1.0 else metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, title="mean ± std over seeds", title_fontsize=7)
    fig.tight_layout()
    return fig


#: file suffixes a figure may be written as (the formats matplotlib writes without extras)
def plot_curves(
    run_dirs: list[str | Path],
    path: str | Path,
    metric: str = "target_accuracy",
    *,
    flag: str = "figure",
    force: bool = False,
) -> Path:
    """Write the curves of ``metric`` (see :func:`curve_groups`) as a figure (PNG, PDF, SVG
    or JPEG by the suffix) under the output rule of :mod:`fedshift.core.outputs` (``flag``
    names the path in messages; ``force`` replaces a file fedshift did not write); returns
    its path."""
    check_output(path, FIGURE, flag, force=force)
    metric, groups = curve_groups(run_dirs, metric)
    fig = draw_curves(groups, metric)
    import matplotlib.pyplot as plt

    try:
        return write_figure(fig, path, flag, force=force, dpi=120)
    finally:
        plt.close(fig)
