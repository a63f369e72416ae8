"""Tables (mean ± std over seeds) from run directories (curves: :mod:`fedshift.report.curves`)."""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from fedshift.core.runfiles import read_summary, summary_files


def find_summaries(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Every readable ``summary.json`` under ``paths`` (a run dir or a folder of run dirs)."""
    found = []
    for root in paths:
        root = Path(root)
        if not root.exists():
            raise FileNotFoundError(f"{root} does not exist")
        for file in summary_files(root):
            summary = read_summary(file)  # None (with a warning) when half-written
            if summary is None:
                continue
            summary["_run_dir"] = str(file.parent)
            found.append(summary)
    return found


def mean_std(values: list[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), std


def is_fraction(metric: str) -> bool:
    """Accuracies and Dice scores are stored as fractions and shown in %."""
    return "accuracy" in metric or "dice" in metric


def cell(values: list[float], scale: float = 100.0) -> str:
    """``mean ± std`` of ``values`` times ``scale``: one decimal, or whole numbers with
    thousands separators for large quantities (bytes, seconds)."""
    if not values:
        return "-"
    m, s = mean_std(values)
    spec = ",.0f" if abs(scale * m) >= 1000 else ".1f"
    if len(values) == 1:
        return f"{scale * m:{spec}}"
    return f"{scale * m:{spec}} ± {scale * s:{spec}}"


#: the summary key that says a metric's round predicted one class for every image
CHANCE_KEYS = {"target_accuracy": "at_chance", "target_accuracy_last": "at_chance_last"}
#: what a table cell holding such a run carries
CHANCE_MARK = " (chance)"


def at_chance(summary: dict[str, Any], metric: str) -> bool:
    """Whether ``summary``'s ``metric`` comes from a round that predicted one class for every
    image (:func:`fedshift.engine.evaluation.at_chance`)."""
    return summary.get(CHANCE_KEYS.get(metric, "")) is True


def row_of(summary: dict[str, Any]) -> str:
    """The table row of a summary: the row label the report's experiment kinds gave it
    (algorithm and the hyperparameters that tell its rows apart), else its algorithm."""
    return str(summary.get("_row") or summary["algorithm"])


def ordered_rows(labels: Iterable[str], algorithms: list[str] | None) -> list[str]:
    """Row labels sorted, or in the order of ``algorithms`` (each algorithm's labels
    sorted; rows of other algorithms left out)."""
    labels = sorted(set(labels))
    if not algorithms:
        return labels
    return [
        label
        for algorithm in algorithms
        for label in labels
        if label == algorithm or label.startswith(f"{algorithm} (")
    ]


def table(
    summaries: list[dict[str, Any]], metric: str = "target_accuracy", rows: list[str] | None = None
) -> tuple[list[str], list[list[str]]]:
    """Rows: algorithm (see :func:`row_of`); columns: targets (+ avg); cells: mean ± std over
    seeds (accuracies and Dice in %, other metrics such as ``bytes_per_round`` as they are).

    The summaries must be one experiment kind with one run per cell and seed
    (:func:`fedshift.report.experiments.kinds`); a second run of a cell and seed raises.
    The average column is the mean over targets of each seed's accuracy, then mean ± std over
    seeds (only for seeds that have every target). A cell with a run whose round predicted
    one class for every image carries :data:`CHANCE_MARK`.
    """
    by: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    chance: set[tuple[str, str]] = set()  # cells with a run at chance level
    targets: list[str] = []
    for s in summaries:
        if s.get(metric) is None:  # not measured, or not finite (written as null)
            continue
        seeds = by[row_of(s)][s["target"]]
        if s["seed"] in seeds:
            raise ValueError(f"two runs of {row_of(s)} -> {s['target']} with seed {s['seed']}")
        seeds[s["seed"]] = s[metric]
        if at_chance(s, metric):
            chance.add((row_of(s), s["target"]))
        if s["target"] not in targets:
            targets.append(s["target"])
    order = ordered_rows(by, rows)
    header = ["method", *targets, "avg"]
    body = []
    for algo in order:
        if algo not in by:
            continue
        per_target = by[algo]
        scale = 100.0 if is_fraction(metric) else 1.0
        line = [algo] + [
            cell(list(per_target.get(t, {}).values()), scale)
            + (CHANCE_MARK if (algo, t) in chance else "")
            for t in targets
        ]
        seeds = (
            set.intersection(*(set(per_target.get(t, {})) for t in targets)) if targets else set()
        )
        averages = [
            statistics.fmean(per_target[t][seed] for t in targets) for seed in sorted(seeds)
        ]
        line.append(cell(averages, scale))
        body.append(line)
    return header, body


def markdown(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def csv_text(header: list[str], body: list[list[str]]) -> str:
    """CSV rows (a cell holding a comma, such as a grid point, is quoted)."""
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows([header, *body])
    return text.getvalue().rstrip("\n")
