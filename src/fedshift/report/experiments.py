"""Which runs are one experiment: the report's tables never mix two.

Two runs are the same experiment when every setting that defines what is learned and how
it is scored is equal: their ``config.json`` (dataset, protocol, rounds, model, partition,
image size, learning rate, the algorithm's hyperparameters, ...) minus the seed, which is
the replicate axis, and minus :data:`NOT_EXPERIMENT`, the settings that change where or
how fast a run goes, not what it is. A run of a grid sweep leaves out the keys of its grid
point too: the grid point is what the selection chooses among.

An experiment *kind* is one table: the runs that agree on everything but the algorithm,
its hyperparameters, the target and the seed. Its rows are algorithms (with the
hyperparameters that tell two rows of one algorithm apart), its columns targets, its cells
the seeds of one experiment. A seed counts once per cell: a second run of the same
experiment and seed (a copy, a re-run elsewhere) is left out and named.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from fedshift.algorithms import REGISTRY
from fedshift.core.runfiles import RunFiles

#: the replicate axis of a table cell
SEED = "seed"
#: config keys that never tell two experiments apart: where a run ran, how fast, how it was
#: watched and where its files came from (the runs' numbers may differ in the last bits
#: between devices, thread counts or compiled kernels; the experiment is the same)
NOT_EXPERIMENT = (
    SEED,
    "device",
    "threads",
    "tracking",
    "run_info",
    "data_root",
    "preset",
    "preset_sha256",
    "checkpoint_every",
    "eval_batch_size",
    "vectorize",
    "augment_backend",
    "channels_last",
    "compile",
)
#: the keys a table lays out itself: rows (algorithm and its hyperparameters), columns
TABLE_AXES = ("algorithm", "target")
#: what a summary without its config.json tells about the experiment
SUMMARY_SETTINGS = ("dataset", "protocol", "rounds", "model_selection")
#: how a setting a run does not record is shown
UNRECORDED = "-"
#: the value of a setting a grid sweep varies: the selection chooses among its values
GRID = "(grid)"


@dataclass
class Kind:
    """One table's runs: those that differ only in algorithm, hyperparameters, target and
    seed. ``label`` names what tells this kind apart from the others in the report
    (empty when there is one); ``summaries`` holds one run per cell and seed, each with its
    row label in ``_row``; ``duplicates`` pairs each left-out run dir with the kept one."""

    label: str
    summaries: list[dict[str, Any]] = field(default_factory=list)
    duplicates: list[tuple[str, str]] = field(default_factory=list)


def hyperparameters(algorithm: str, chosen: dict[str, Any]) -> dict[str, Any]:
    """An algorithm's hyperparameters as ``algo.NAME`` keys: the defaults of a built-in or
    registered algorithm, overridden by the ``chosen`` ones a config records (a run that
    sets a default explicitly is the same experiment as one that leaves it)."""
    values: dict[str, Any] = {}
    if REGISTRY.known(algorithm):  # never loads a plug-in to read a report
        defaults = REGISTRY[algorithm].Hparams()
        values = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(defaults)}
    values.update(chosen)
    return {f"algo.{name}": value for name, value in values.items()}


def settings(summary: dict[str, Any]) -> dict[str, Any]:
    """The settings that define a run's experiment, one level deep (the seed and the
    :data:`NOT_EXPERIMENT` keys left out, the keys of the run's grid point as
    :data:`GRID`): its ``config.json``, else what its summary records."""
    config = None
    if summary.get("_run_dir"):
        config = RunFiles(summary["_run_dir"]).read_config()
    if not isinstance(config, dict):
        config = {k: summary[k] for k in (*TABLE_AXES, *SUMMARY_SETTINGS) if k in summary}
    chosen = config.get("algo") if isinstance(config.get("algo"), dict) else {}
    flat = {k: v for k, v in config.items() if k != "algo"}
    flat.update(hyperparameters(str(config.get("algorithm", summary["algorithm"])), chosen))
    flat.update({key: GRID for key in summary.get("grid") or {}})
    return {k: v for k, v in flat.items() if k not in NOT_EXPERIMENT}


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _differing(rows: list[dict[str, Any]]) -> list[str]:
    """The keys whose value (or presence) differs between ``rows``, sorted."""
    keys = sorted({k for row in rows for k in row})
    return [k for k in keys if len({_text(row.get(k, UNRECORDED)) for row in rows}) > 1]


def _shown(value: Any) -> str:
    return value if isinstance(value, str) else _text(value)


def describe(values: dict[str, Any], keys: list[str]) -> str:
    """``key=value`` for each of ``keys`` (unrecorded ones as ``key=-``), comma-separated."""
    return ", ".join(f"{k}={_shown(values.get(k, UNRECORDED))}" for k in keys)


def kinds(summaries: list[dict[str, Any]]) -> list[Kind]:
    """The runs split into experiment kinds (first-seen order), each run's row label set,
    and each cell's seeds counted once (the first run in the given order is kept)."""
    per_run = [settings(s) for s in summaries]
    shape = [
        {k: v for k, v in run.items() if k not in TABLE_AXES and not k.startswith("algo.")}
        for run in per_run
    ]
    identities = [_text(kind) for kind in shape]
    order = list(dict.fromkeys(identities))
    firsts = [shape[identities.index(identity)] for identity in order]
    differing = _differing(firsts) if len(order) > 1 else []
    result = {
        identity: Kind(describe(first, differing))
        for identity, first in zip(order, firsts, strict=True)
    }
    members: dict[str, list[int]] = {identity: [] for identity in order}
    for index, identity in enumerate(identities):
        members[identity].append(index)
    for identity, indices in members.items():
        kind = result[identity]
        rows = _row_labels([summaries[i] for i in indices], [per_run[i] for i in indices])
        kept: dict[tuple[str, str, str, Any], str] = {}
        for i, row in zip(indices, rows, strict=True):
            summary = summaries[i]
            grid = summary.get("grid") or {}
            cell = (row, str(summary["target"]), _text(grid), summary[SEED])
            run_dir = str(summary.get("_run_dir", "?"))
            if cell in kept:
                kind.duplicates.append((run_dir, kept[cell]))
                continue
            kept[cell] = run_dir
            kind.summaries.append({**summary, "_row": row})
    return [result[identity] for identity in order]


def _row_labels(summaries: list[dict[str, Any]], per_run: list[dict[str, Any]]) -> list[str]:
    """Each run's row: its algorithm, plus the hyperparameters (outside any grid point)
    that differ between runs of that algorithm in this kind."""
    by_algorithm: dict[str, list[int]] = {}
    for index, summary in enumerate(summaries):
        by_algorithm.setdefault(str(summary["algorithm"]), []).append(index)
    labels = [str(s["algorithm"]) for s in summaries]
    for algorithm, indices in by_algorithm.items():
        hyper = [{k: v for k, v in per_run[i].items() if k.startswith("algo.")} for i in indices]
        differing = _differing(hyper)
        if differing:
            for i, values in zip(indices, hyper, strict=True):
                labels[i] = f"{algorithm} ({describe(values, differing)})"
    return labels


def report_text(
    summaries: list[dict[str, Any]],
    metric: str = "target_accuracy",
    rows: list[str] | None = None,
    fmt: str = "md",
) -> tuple[str, list[str]]:
    """The report's tables, one per experiment kind (headed by what tells it apart when
    there are several), and its notes (each run left out as a repeated seed).

    A kind with grid-sweep runs gets the per-grid-point table and the selected tables
    (markdown), or the per-grid-point table (csv); any other kind the method x target
    table.
    """
    from fedshift.report.aggregate import at_chance, csv_text, markdown, table
    from fedshift.report.selection import has_grid, points_table, selection_markdown

    found = kinds(summaries)
    sections, notes = [], []
    for number, kind in enumerate(found, start=1):
        if not any(isinstance(s.get(metric), int | float) for s in kind.summaries):
            notes.append(f"experiment {number} ({kind.label}): no run holds {metric}")
            continue
        if has_grid(kind.summaries):
            if fmt == "md":
                text = selection_markdown(kind.summaries, metric, rows)
            else:
                text = csv_text(*points_table(kind.summaries, metric, rows))
        else:
            header, body = table(kind.summaries, metric, rows)
            text = markdown(header, body) if fmt == "md" else csv_text(header, body)
        if len(found) > 1:
            runs = len(kind.summaries)
            counted = f"{runs} run" if runs == 1 else f"{runs} runs"
            heading = f"experiment {number} of {len(found)}: {kind.label} ({counted})"
            text = f"## {heading}\n\n{text}" if fmt == "md" else f"# {heading}\n{text}"
        sections.append(text)
        notes += [
            f"{dropped} repeats the experiment and seed of {kept}: counted once"
            for dropped, kept in kind.duplicates
        ]
        notes += [
            f"{s.get('_run_dir', s['algorithm'])}: {metric} is at "
            "chance level (every scored domain at one class's share: one class predicted for "
            "every image); its cell is marked (chance)"
            for s in kind.summaries
            if at_chance(s, metric)
        ]
    return "\n\n".join(sections), notes
