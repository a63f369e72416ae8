"""Paper presets: TOML files, shipped in this package, that each reproduce one experiment of
a seed paper (dataset, protocol, backbone, rounds, optimizer, the method's hyperparameters).

A preset file holds run keys at the top level (as a ``--config`` file), an ``[algo]`` table
of the algorithm's hyperparameters and a ``[preset]`` table describing the experiment:
``paper``, ``setting``, ``paper_result`` (the number the paper reports and where) and
``deviations`` (where fedshift's keys cannot express the paper's setting). Run one with
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

from fedshift.core.bounded import MAX_TOML_BYTES, parse_toml, read_bytes_bounded
from fedshift.core.errors import ConfigError, did_you_mean
from fedshift.core.runconfig import RUN_KEYS

#: where the shipped preset files lie (package data)
PRESET_DIR = Path(__file__).parent
#: run keys a preset file cannot set: they record which preset a run started from
RECORD_KEYS = ("preset", "preset_sha256")
#: keys of a preset file's ``[preset]`` table -> whether a shipped preset must have it
META_KEYS = {"paper": True, "setting": True, "paper_result": True, "deviations": False}


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


def preset_names() -> list[str]:
    """The shipped presets, sorted by name."""
    return sorted(path.stem for path in PRESET_DIR.glob("*.toml"))


def is_path(ref: str) -> bool:
    """Whether a ``--preset`` value names a file rather than a shipped preset."""
    return ref.endswith(".toml") or "/" in ref or os.sep in ref


def preset_path(ref: str) -> tuple[str, Path]:
    """The recorded name and the file of a preset given by name or path."""
    if is_path(ref):
        path = Path(ref).expanduser()
        if not path.is_file():
            raise ConfigError(f"preset file {ref} does not exist")
        return ref, path
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
    """The ``[preset]`` table: known keys, strings (``deviations`` a list of strings)."""
    for key, value in table.items():
        if key not in META_KEYS:
            raise ConfigError(
                f"preset file {path}: unknown key 'preset.{key}'"
                f"{did_you_mean(key, list(META_KEYS))}; valid: {', '.join(META_KEYS)}"
            )
        if key == "deviations":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"preset file {path}: 'preset.deviations' must be strings")
        elif not isinstance(value, str):
            raise ConfigError(f"preset file {path}: 'preset.{key}' must be a string")
    return dict(table)
