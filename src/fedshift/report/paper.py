"""The paper's number beside fedshift's for runs started from a preset (``fedshift report``)."""

from __future__ import annotations

from typing import Any

from fedshift.core.errors import ConfigError
from fedshift.core.runfiles import RunFiles
from fedshift.presets import load_preset, paper_line


def paper_lines(summaries: list[dict[str, Any]]) -> list[str]:
    """One line per preset the runs started from (their ``config.json`` records it) that has a
    structured paper number: the paper's value and fedshift's mean over those runs (runs
    that chose another algorithm than the preset's are left out: the number is not theirs)."""
    by_preset: dict[str, list[dict[str, Any]]] = {}
    for summary in summaries:
        config = RunFiles(summary["_run_dir"]).read_config() or {}
        if config.get("preset"):
            by_preset.setdefault(str(config["preset"]), []).append(summary)
    lines = []
    for name, runs in by_preset.items():
        try:
            preset = load_preset(name)
        except ConfigError:  # a user's preset file that is gone: nothing to compare to
            continue
        own = [s for s in runs if s.get("algorithm") == preset.algorithm]
        line = paper_line(preset.meta, own) if own else None
        if line:
            lines.append(f"{name}: {line}")
    return lines
