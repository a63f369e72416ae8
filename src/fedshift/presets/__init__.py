"""Paper presets: TOML files, shipped in this package, that each reproduce one experiment of
a seed paper (dataset, protocol, backbone, rounds, optimizer, the method's hyperparameters).

A preset file holds run keys at the top level (as a ``--config`` file), an ``[algo]`` table
of the algorithm's hyperparameters and a ``[preset]`` table describing the experiment:
``paper``, ``setting``, ``paper_result`` (the number the paper reports and where),
``deviations`` (where fedshift's keys cannot express the paper's setting) and, where the
number was found in a verifiable copy, ``paper_value`` (percent), ``paper_metric`` (the
fedshift summary key it compares to) and ``paper_source`` (table and paper). Run one with
``fedshift run --preset NAME`` (or a path to your own file); its settings lie below the
``--config`` file, the flags and ``--set``. This module only reads and checks the files'
shape and run-key names; :func:`fedshift.config.check_preset` checks their values against
the run config and the algorithm's hyperparameters.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedshift.core.bounded import (
    MAX_TOML_BYTES,
    check_regular_file,
    parse_toml,
    read_bytes_bounded,
)
from fedshift.core.errors import ConfigError, did_you_mean
from fedshift.core.runconfig import RUN_KEYS

#: where the shipped preset files lie (package data)
PRESET_DIR = Path(__file__).parent
#: run keys a preset file cannot set: they record which preset a run started from
RECORD_KEYS = ("preset", "preset_sha256")
#: keys of a preset file's ``[preset]`` table -> whether a shipped preset must have it
META_KEYS = {
    "paper": True,
    "setting": True,
    "paper_result": True,
    "deviations": False,
    "paper_value": False,
    "paper_metric": False,
    "paper_source": False,
}
#: the structured paper number: all three keys or none
PAPER_NUMBER_KEYS = ("paper_value", "paper_metric", "paper_source")
#: fedshift summary keys a paper's number may be compared to
PAPER_METRICS = (
    "target_accuracy",
    "target_accuracy_last",
    "target_accuracy_last5",
    "target_accuracy_min_idd",
    "personalized_accuracy",
)


@dataclass(frozen=True)
class Preset:
    """One preset file, read and shape-checked."""

    #: the shipped preset's name (file stem), or the path a user file was given by
    name: str
    path: Path
    #: SHA-256 of the file's bytes, recorded in the run's config.json
    sha256: str
    #: flat run settings, ``algo.NAME`` for the algorithm's hyperparameters
    settings: dict[str, Any]
    #: the ``[preset]`` table: paper, setting, paper_result, deviations
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def algorithm(self) -> str:
        return str(self.settings.get("algorithm", "fedavg"))

    @property
    def dataset(self) -> str:
        return str(self.settings.get("dataset", "digits-dg"))

    @property
    def paper_number(self) -> str | None:
        """``"92.9 % target_accuracy_min_idd (FACT, Table 1, ...)"``, or None when the
        paper's number was not found."""
        return paper_number(self.meta)


def paper_number(meta: dict[str, Any]) -> str | None:
    """The structured paper number of a ``[preset]`` table as one phrase, or None."""
    if "paper_value" not in meta:
        return None
    return f"{meta['paper_value']:g} % {meta['paper_metric']} ({meta['paper_source']})"


def paper_line(meta: dict[str, Any], summaries: list[dict[str, Any]]) -> str | None:
    """The paper's number beside fedshift's, each with its metric, e.g. ``paper: 92.9 %
    (FACT, Table 1, ...) · fedshift: 81.2 % target_accuracy_min_idd (1 run, seed 0)``; over
    several runs fedshift's is their mean. None when the preset has no structured number."""
    if "paper_value" not in meta:
        return None
    metric = meta["paper_metric"]
    scored = [s for s in summaries if isinstance(s.get(metric), int | float)]
    ours = f"{100 * sum(s[metric] for s in scored) / len(scored):.1f} %" if scored else "n/a"
    seeds = ", ".join(str(s.get("seed", "?")) for s in scored)
    runs = f"1 run, seed {seeds}" if len(scored) == 1 else f"mean of {len(scored)} runs"
    if len(scored) > 1:
        runs += f", seeds {seeds}"
    return (
        f"paper: {meta['paper_value']:g} % ({meta['paper_source']}) · fedshift: {ours} "
        f"{metric} ({runs})"
    )


def preset_names() -> list[str]:
    """The shipped presets, sorted by name."""
    return sorted(path.stem for path in PRESET_DIR.glob("*.toml"))


def is_path(ref: str) -> bool:
    """Whether a ``--preset`` value names a file rather than a shipped preset."""
    return ref.endswith(".toml") or "/" in ref or os.sep in ref


def preset_path(ref: str) -> tuple[str, Path]:
    """The recorded name and the file of a preset given by name or path."""
    if is_path(ref):
        return ref, check_regular_file(Path(ref).expanduser(), "preset file", ConfigError)
    names = preset_names()
    if ref not in names:
        raise ConfigError(
            f"unknown preset {ref!r}{did_you_mean(ref, names)}; presets: {', '.join(names)} "
            "(or give a path to a .toml file)"
        )
    return ref, PRESET_DIR / f"{ref}.toml"


def load_preset(ref: str | os.PathLike) -> Preset:
    """Read preset ``ref`` (a shipped name or a path to a TOML file); one-line ConfigError
    naming the file and the key when the file is not valid TOML or holds an unknown key."""
    name, path = preset_path(os.fspath(ref))
    raw = read_bytes_bounded(path, MAX_TOML_BYTES, ConfigError, "preset file")
    data = parse_toml(raw, ConfigError, f"preset file {path}")
    settings: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    for key, value in data.items():
        if key == "algo":
            if not isinstance(value, dict):
                raise ConfigError(f"preset file {path}: 'algo' must be a table ([algo])")
            settings.update({f"algo.{k}": v for k, v in value.items()})
        elif key == "preset":
            if not isinstance(value, dict):
                raise ConfigError(
                    f"preset file {path}: 'preset' must be the [preset] table (paper, "
                    "setting, ...); a preset cannot start from another preset"
                )
            meta = check_meta(path, value)
        elif key in RECORD_KEYS:
            raise ConfigError(
                f"preset file {path}: key {key!r} records the preset a run started from; "
                "a preset cannot set it"
            )
        elif key not in RUN_KEYS:
            noun = "table" if isinstance(value, dict) else "key"
            raise ConfigError(
                f"preset file {path}: unknown {noun} {key!r}"
                f"{did_you_mean(key, [*RUN_KEYS, 'algo', 'preset'])}; valid: the run keys "
                "(see `fedshift run --help`), [algo] and [preset]"
            )
        elif isinstance(value, dict):
            raise ConfigError(f"preset file {path}: run key {key!r} takes a value, not a table")
        else:
            settings[key] = value
    digest = hashlib.sha256(raw).hexdigest()
    return Preset(name=name, path=path, sha256=digest, settings=settings, meta=meta)


def check_meta(path: Path, table: dict[str, Any]) -> dict[str, Any]:
    """The ``[preset]`` table: known keys, strings (``deviations`` a list of strings,
    ``paper_value`` a percentage, ``paper_metric`` a summary key; the three paper-number keys
    together or not at all)."""
    given = [key for key in PAPER_NUMBER_KEYS if key in table]
    if given and len(given) < len(PAPER_NUMBER_KEYS):
        missing = ", ".join(f"preset.{key}" for key in PAPER_NUMBER_KEYS if key not in table)
        raise ConfigError(
            f"preset file {path}: {', '.join(f'preset.{k}' for k in given)} needs {missing} "
            "too (the paper's number, the summary key it compares to, and its source)"
        )
    for key, value in table.items():
        if key not in META_KEYS:
            raise ConfigError(
                f"preset file {path}: unknown key 'preset.{key}'"
                f"{did_you_mean(key, list(META_KEYS))}; valid: {', '.join(META_KEYS)}"
            )
        if key == "deviations":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"preset file {path}: 'preset.deviations' must be strings")
        elif key == "paper_value":
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(
                    f"preset file {path}: 'preset.paper_value' must be a number (percent), "
                    f"got {value!r}"
                )
            if not 0 <= value <= 100:
                raise ConfigError(
                    f"preset file {path}: 'preset.paper_value' is a percentage in [0, 100], "
                    f"got {value}"
                )
        elif key == "paper_metric" and value not in PAPER_METRICS:
            raise ConfigError(
                f"preset file {path}: unknown preset.paper_metric {value!r}"
                f"{did_you_mean(str(value), list(PAPER_METRICS))}; choose one of: "
                f"{', '.join(PAPER_METRICS)}"
            )
        elif not isinstance(value, str):
            raise ConfigError(f"preset file {path}: 'preset.{key}' must be a string")
    return dict(table)
