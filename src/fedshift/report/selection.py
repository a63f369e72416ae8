"""Hyperparameter selection over a sweep's grid points (DomainBed's protocols).

A run of a grid sweep records its grid point in ``summary.json`` (``"grid": {"algo.mu":
0.01}``). Runs are grouped by (algorithm, target, grid point), mean ± std over seeds, and for
each (algorithm, target) one grid point is chosen:

- **training-domain validation** (``source-val``, the honest choice): the grid point with
  the best mean source-validation accuracy (``source_val_accuracy``, the accuracy on the
  source clients' validation splits at the round source validation selected);
- **oracle** (uses target labels, reported only as such): the grid point with the best mean
  of the reported metric itself (``target_accuracy`` by default).

The reported number is the chosen grid point's metric, mean ± std over its seeds. Ties go
to the first grid point in sorted order, so the choice never depends on file order.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from fedshift.report.aggregate import (
    cell,
    is_fraction,
    markdown,
    mean_std,
    ordered_rows,
    row_of,
    table,
)

SOURCE_VAL = "source_val_accuracy"
#: the label of a run without a grid point (a plain sweep, or defaults)
NO_GRID = "(defaults)"
CHOICES = ("source-val", "oracle")


def has_grid(summaries: list[dict[str, Any]]) -> bool:
    """Whether any run was part of a grid sweep."""
    return any(s.get("grid") for s in summaries)


def grid_label(summary: dict[str, Any]) -> str:
    """A run's grid point as ``algo.mu=0.01,lr=0.05`` (keys sorted)."""
    grid = summary.get("grid") or {}
    return ",".join(f"{k}={grid[k]}" for k in sorted(grid)) or NO_GRID


Groups = dict[tuple[str, str], dict[str, list[dict[str, Any]]]]


def group(summaries: list[dict[str, Any]], metric: str) -> Groups:
    """(row, target) -> grid label -> the summaries (one per seed) holding ``metric``; the
    row is the algorithm (:func:`~fedshift.report.aggregate.row_of`)."""
    groups: Groups = defaultdict(lambda: defaultdict(list))
    for s in summaries:
        if isinstance(s.get(metric), int | float):
            groups[(row_of(s), s["target"])][grid_label(s)].append(s)
    return groups


def numbers(runs: list[dict[str, Any]], key: str) -> list[float]:
    """The finite values of ``key`` in ``runs``."""
    values = [r.get(key) for r in runs]
    return [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]


def choose(points: dict[str, list[dict[str, Any]]], key: str) -> str | None:
    """The grid label whose runs have the highest mean ``key`` (first in sorted order on a
    tie); None when no grid point has a value of ``key``."""
    best, best_mean = None, -math.inf
    for label in sorted(points):
        values = numbers(points[label], key)
        if values and mean_std(values)[0] > best_mean:
            best, best_mean = label, mean_std(values)[0]
    return best


def choices(summaries: list[dict[str, Any]], metric: str) -> dict[str, dict[tuple, str | None]]:
    """``source-val`` and ``oracle`` -> (algorithm, target) -> the chosen grid label."""
    groups = group(summaries, metric)
    return {
        "source-val": {key: choose(points, SOURCE_VAL) for key, points in groups.items()},
        "oracle": {key: choose(points, metric) for key, points in groups.items()},
    }


def selected(summaries: list[dict[str, Any]], metric: str, by: str) -> list[dict[str, Any]]:
    """The summaries of the grid point chosen by ``by`` (``source-val`` or ``oracle``) for
    each (algorithm, target): every seed of that point."""
    groups = group(summaries, metric)
    picked = choices(summaries, metric)[by]
    return [s for key, label in picked.items() if label is not None for s in groups[key][label]]


def points_table(
    summaries: list[dict[str, Any]], metric: str = "target_accuracy", rows: list[str] | None = None
) -> tuple[list[str], list[list[str]]]:
    """One row per (algorithm, target, grid point): seeds, source-validation accuracy and
    ``metric`` (mean ± std over seeds), and which selection chose it."""
    groups = group(summaries, metric)
    picked = choices(summaries, metric)
    scale = 100.0 if is_fraction(metric) else 1.0
    header = ["method", "target", "grid point", "seeds", "source val", metric, "chosen by"]
    order = ordered_rows((row for row, _ in groups), rows)
    body = []
    for algorithm in order:
        for (algo, target), points in groups.items():
            if algo != algorithm:
                continue
            for label in sorted(points):
                runs = points[label]
                chosen = [
                    "source-val" if picked["source-val"][(algo, target)] == label else "",
                    "oracle (target labels)" if picked["oracle"][(algo, target)] == label else "",
                ]
                body.append(
                    [
                        algo,
                        target,
                        label,
                        str(len(runs)),
                        cell(numbers(runs, SOURCE_VAL)),
                        cell(numbers(runs, metric), scale),
                        " + ".join(c for c in chosen if c),
                    ]
                )
    return header, body


def selection_table(
    summaries: list[dict[str, Any]],
    metric: str = "target_accuracy",
    rows: list[str] | None = None,
    by: str = "source-val",
) -> tuple[list[str], list[list[str]]]:
    """Today's method × target table (+ avg) over the grid points chosen by ``by``."""
    return table(selected(summaries, metric, by), metric, rows)


def selection_markdown(
    summaries: list[dict[str, Any]], metric: str = "target_accuracy", rows: list[str] | None = None
) -> str:
    """The grid points, then the source-validation choice, then the oracle choice."""
    sections = [
        f"### {metric} per grid point (mean ± std over seeds)",
        markdown(*points_table(summaries, metric, rows)),
        f"### {metric}, grid point selected by source validation (training-domain validation)",
        markdown(*selection_table(summaries, metric, rows, "source-val")),
        f"### {metric}, grid point selected by {metric} — ORACLE: uses target labels, "
        "an upper bound, not a result",
        markdown(*selection_table(summaries, metric, rows, "oracle")),
    ]
    return "\n\n".join(sections)
