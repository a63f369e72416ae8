"""The run directory, the product users keep, as one type: its file names, readers, writers
and the one rule for when a run resumes and what its resumed config may change.

A run directory holds ``config.json`` (the resolved config, written first),
``metrics.jsonl`` (one row per round), ``checkpoint.pt`` (and ``checkpoint.prev.pt``, the
one before), ``summary.json`` (written last) and the ownership files of
:mod:`fedshift.engine.run.rundir` (``.lock``, ``.fedshift-run``). Every other module names
these files through :class:`RunFiles`, never by a literal.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedshift.core.bounded import open_regular, parse_json, read_json_bounded, read_text_lines
from fedshift.core.errors import CheckpointError
from fedshift.core.runconfig import FIXED, MAY_CHANGE, MAY_GROW, RunConfig
from fedshift.core.state import (
    has_checkpoint,
    load_checkpoint,
    roll_back_checkpoint,
    write_text_atomically,
)

log = logging.getLogger(__name__)

CONFIG = "config.json"
SUMMARY = "summary.json"
METRICS = "metrics.jsonl"
CHECKPOINT = "checkpoint.pt"
PREVIOUS_CHECKPOINT = "checkpoint.prev.pt"
LOCK_NAME = ".lock"
MARKER_NAME = ".fedshift-run"

#: SQLite's side files of ``mlflow.db`` (a journal a killed writer may leave)
MLFLOW_SIDE_FILES = ("mlflow.db-journal", "mlflow.db-wal", "mlflow.db-shm")
#: every name a run writes at the top of its directory (temp files match :data:`OWN_TEMP_FILE`)
OWN_NAMES = frozenset(
    {
        LOCK_NAME,
        MARKER_NAME,
        CONFIG,
        SUMMARY,
        CHECKPOINT,
        PREVIOUS_CHECKPOINT,
        METRICS,
        "tensorboard",
        "wandb",
        "mlflow.db",
        *MLFLOW_SIDE_FILES,
    }
)
#: the files a run replaces through a temp file ``<name>.<random>.tmp`` (core.state.atomic_file)
ATOMIC_NAMES = (CONFIG, SUMMARY, METRICS, CHECKPOINT, PREVIOUS_CHECKPOINT)
#: a temp file a killed writer of this run left behind (and nothing a user may have named
#: ``*.tmp``): one of :data:`ATOMIC_NAMES`, a dot, mkstemp's random part, ``.tmp``
OWN_TEMP_FILE = re.compile(
    r"^(" + "|".join(re.escape(name) for name in ATOMIC_NAMES) + r")\.[A-Za-z0-9_]+\.tmp$"
)
#: what a run's trackers put at the top of their own folders; anything else there is foreign
OWN_FOLDER_ENTRIES = {
    # TensorBoard's SummaryWriter: one event file per session, nothing else
    "tensorboard": re.compile(r"^events\.out\.tfevents\.[^/]+$"),
    # W&B offline runs (``offline-run-DATE_TIME-ID``), its ``latest-run`` link and debug logs
    "wandb": re.compile(
        r"^((offline-)?run-\d{8}_\d{6}-[A-Za-z0-9]+"
        r"|latest-run|debug(-internal|-cli\.[^/]+)?\.log)$"
    ),
}
#: keys every summary has; a file without them is not a fedshift summary
SUMMARY_KEYS = ("algorithm", "target", "seed")
#: the key listing, in a row or summary, the values that were not finite numbers
NONFINITE = "nonfinite"


def _finite(value: Any, path: str, found: list[str]) -> Any:
    """``value`` with every NaN or infinite float replaced by None, its dotted key path
    appended to ``found``."""
    if isinstance(value, float) and not math.isfinite(value):
        found.append(path)
        return None
    if isinstance(value, dict):
        return {k: _finite(v, f"{path}.{k}" if path else str(k), found) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v, f"{path}.{i}", found) for i, v in enumerate(value)]
    return value


def strict_json(data: dict[str, Any], *, indent: int | None = None) -> str:
    """``data`` as strict JSON (no ``NaN``/``Infinity``, which JSON does not have): a value
    that is not a finite number is written as null and its key path listed under
    :data:`NONFINITE`, so a reader can tell "not measured" from "diverged"."""
    found: list[str] = []
    clean = _finite(data, "", found)
    if found:
        clean[NONFINITE] = found
    return json.dumps(clean, indent=indent, allow_nan=False)


def read_json_file(path: str | os.PathLike) -> dict[str, Any] | None:
    """A JSON object from ``path``, or None (one warning line) when it is unreadable or
    half-written; a missing file is None without a warning."""
    if not Path(path).exists():
        return None
    try:
        data = read_json_bounded(path, CheckpointError)
    except CheckpointError as exc:
        log.warning("skipping %s: unreadable or half-written (%s)", path, exc)
        return None
    if not isinstance(data, dict):
        log.warning("skipping %s: not a JSON object", path)
        return None
    return data


def load_json_object(path: str | os.PathLike) -> dict[str, Any]:
    """A JSON object from ``path``; anything else is a CheckpointError naming the file."""
    data = read_json_bounded(path, CheckpointError)
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} does not hold a JSON object")
    return data


def read_summary(path: str | os.PathLike) -> dict[str, Any] | None:
    """A run's ``summary.json`` (the file or its run directory), or None with a warning
    when it is half-written or lacks the keys every summary has."""
    path = Path(path)
    if path.is_dir():
        path = path / SUMMARY
    summary = read_json_file(path)
    if summary is None:
        return None
    missing = [k for k in SUMMARY_KEYS if k not in summary]
    if missing:
        log.warning("skipping %s: not a fedshift summary (no %s)", path, ", ".join(missing))
        return None
    return summary


def summary_files(root: str | os.PathLike) -> list[Path]:
    """``root`` itself when it is a file, else every ``summary.json`` under it, sorted."""
    root = Path(root)
    return [root] if root.is_file() else sorted(root.rglob(SUMMARY))


def run_dirs_with_metrics(root: str | os.PathLike) -> list[Path]:
    """Every run directory under ``root`` (``root`` included) that has a ``metrics.jsonl``."""
    return [f.parent for f in sorted(Path(root).rglob(METRICS))]


@dataclass(frozen=True)
class RunFiles:
    """The files of the run directory ``root``."""

    root: Path

    def __init__(self, root: str | os.PathLike):
        object.__setattr__(self, "root", Path(root))

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def checkpoint(self) -> Path:
        return self.root / CHECKPOINT

    @property
    def previous_checkpoint(self) -> Path:
        return self.root / PREVIOUS_CHECKPOINT

    def has_checkpoint(self) -> bool:
        """Whether a checkpoint (latest or previous) is there."""
        return has_checkpoint(self.root, CHECKPOINT)

    def resumes(self, resume: bool = True) -> bool:
        """The resume rule: a run asked to resume (a sweep always is) continues from its
        checkpoint when it has one and starts from round 1 otherwise."""
        return resume and self.has_checkpoint()

    def check_roll_back(self) -> None:
        """Refuse (CheckpointError) a rollback of a run without a previous checkpoint."""
        if not self.previous_checkpoint.is_file():
            raise CheckpointError(
                f"cannot resume previous: no {PREVIOUS_CHECKPOINT} in {self.root} (a run keeps "
                "one from its second checkpoint on); use --resume to continue the latest"
            )

    def roll_back(self) -> int:
        """The rollback rule: the previous checkpoint becomes the latest, ``metrics.jsonl``
        is cut to its rounds and a ``summary.json`` of the abandoned rounds is removed, so
        resuming continues from the round before the latest checkpoint. Returns that round."""
        self.check_roll_back()
        data = roll_back_checkpoint(self.checkpoint)
        self.write_metrics(data["history"])
        self.summary.unlink(missing_ok=True)
        log.warning(
            "rolled %s back to its previous checkpoint (round %s)", self.root, data["round"]
        )
        return int(data["round"])

    def read_config(self) -> dict[str, Any] | None:
        """``config.json``, or None when it is missing or unreadable."""
        return read_json_file(self.config)

    def read_summary(self) -> dict[str, Any] | None:
        """``summary.json`` (see :func:`read_summary`)."""
        return read_summary(self.summary)

    def metric_lines(self) -> list[str]:
        """The non-empty lines of ``metrics.jsonl`` (FileNotFoundError when it is missing;
        a CheckpointError when it is not a regular file or is too large)."""
        if not self.metrics.exists() and not self.metrics.is_symlink():
            raise FileNotFoundError(2, "missing", str(self.metrics))
        lines = read_text_lines(self.metrics, CheckpointError, "metrics file")
        return [line for line in lines if line.strip()]

    def history(self) -> list[dict[str, Any]]:
        """The rows of ``metrics.jsonl`` (none when it is missing), skipping a line a crash
        cut short (the runner rewrites it on resume)."""
        if not self.metrics.exists() and not self.metrics.is_symlink():
            return []
        rows = []
        for line in read_text_lines(self.metrics, CheckpointError, "metrics file"):
            try:
                row = parse_json(line, CheckpointError, str(self.metrics))
            except CheckpointError:
                continue
            if isinstance(row, dict):
                rows.append(row)
        return rows

    def saved_config(self) -> dict[str, Any]:
        """The config the run was started with: ``config.json``, else its checkpoint's."""
        try:
            saved = read_json_bounded(self.config, CheckpointError)
            if isinstance(saved, dict):
                return saved
        except CheckpointError as exc:
            log.warning("%s; reading the config from the checkpoint", exc)
        if not self.has_checkpoint():
            raise CheckpointError(f"cannot resume: no {CHECKPOINT} in {self.root}")
        return dict(load_checkpoint(self.checkpoint)["config"])

    def write_config(self, config: dict[str, Any]) -> None:
        write_text_atomically(self.config, strict_json(config, indent=2) + "\n")

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_text_atomically(self.summary, strict_json(summary, indent=2) + "\n")

    def write_metrics(self, rows: Iterable[dict[str, Any]]) -> None:
        """Replace ``metrics.jsonl`` with ``rows`` (a resumed run's history)."""
        write_text_atomically(self.metrics, "".join(strict_json(row) + "\n" for row in rows))

    def append_metrics(self, row: dict[str, Any]) -> None:
        """One round's row, flushed to disk before the round's checkpoint."""
        with open_regular(self.metrics, CheckpointError, "metrics file", append=True) as handle:
            handle.write((strict_json(row) + "\n").encode())
            handle.flush()
            os.fsync(handle.fileno())


def resume_rule(name: str) -> str:
    """What ``--resume`` may do with config key ``name``, as its :func:`~fedshift.core.
    runconfig.key` declaration says: ``fixed``, ``may-change`` or ``may-grow`` (an
    algorithm's hyperparameter, ``algo.NAME``, is fixed)."""
    declared = RunConfig.__dataclass_fields__.get(name)
    return declared.metadata.get("resume", FIXED) if declared is not None else FIXED


def resume_conflict(name: str, saved: Any, given: Any) -> str:
    """Why config key ``name`` cannot go from ``saved`` to ``given`` when a run resumes
    (``cannot change``, ``cannot shorten``), or ``""`` when it may: the one resume rule,
    read from the key's declaration. A ``may-grow`` key (rounds) may only grow: a finished
    run given more rounds goes on."""
    if saved == given:
        return ""
    rule = resume_rule(name)
    if rule == MAY_CHANGE:
        return ""
    if rule == MAY_GROW:
        grows = isinstance(saved, int) and isinstance(given, int) and given > saved
        return "" if grows else "cannot shorten"
    return "cannot change"
