"""Every published number's drift prefix reruns bit for bit on the pinned CPU path, and every
rendered table agrees with its stored summaries (benchmarks/results/experiments.py).

A change that moves a number fails here until its prefix is updated on purpose
(``experiments.py update NAME``), which marks the table "stale since" that commit in the
index until it is re-measured (``experiments.py measured NAME``)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "benchmarks" / "results" / "experiments.py"
spec = importlib.util.spec_from_file_location("experiments_tool", TOOL)
experiments = importlib.util.module_from_spec(spec)
spec.loader.exec_module(experiments)

NAMES = experiments.names()
pinned_avx2 = pytest.mark.skipif(
    not torch.cpu._is_avx2_supported(), reason="prefixes are stored on the pinned (AVX2) path"
)


def needs_data(name: str) -> list:
    prefix = experiments.load_prefix(name)
    if not prefix.get("data"):
        return []
    return [pytest.mark.real]


def test_there_are_experiments():
    assert "main-job" in NAMES


@pinned_avx2
@pytest.mark.parametrize("name", [pytest.param(n, marks=needs_data(n)) for n in NAMES])
def test_prefix_reruns_bit_for_bit(name, tmp_path):
    prefix = experiments.load_prefix(name)
    if prefix.get("data") and not os.environ.get("FEDSHIFT_REAL_DATA"):
        pytest.skip(f"{name} reads {prefix['data']}: FEDSHIFT_REAL_DATA is unset")
    now = experiments.run_prefix(prefix, tmp_path)
    assert now["numerics"]["cpu_numerics"] == "pinned"
    found = experiments.differences(prefix, now)
    assert not found, (
        f"{name}'s numbers moved: {found[:5]}; if on purpose, run "
        f"`python benchmarks/results/experiments.py update {name}` (the table then shows as "
        "stale until re-measured)"
    )


def test_rendered_blocks_agree_with_their_summaries():
    assert experiments.render(check_only=True) == 0


def test_differences_see_one_last_bit():
    stored = {"rounds": [{"round": 1, "train_loss": 0.5}], "state_sha256": "a"}
    same = {"rounds": [{"round": 1, "train_loss": 0.5, "cpu_seconds": 9.0}], "state_sha256": "a"}
    assert experiments.differences(stored, same) == []
    moved = {"rounds": [{"round": 1, "train_loss": 0.5000000000000001}], "state_sha256": "a"}
    assert experiments.differences(stored, moved) == [
        "round 1 train_loss: 0.5000000000000001, stored 0.5"
    ]
    assert experiments.differences(stored, {**same, "state_sha256": "b"}) == [
        "final model state differs (sha256)"
    ]


def test_status_says_stale_until_measured():
    prefix = {"state_sha256": "b", "measured_state_sha256": "a", "changed_at": "abc1234"}
    assert experiments.status(prefix) == "stale since abc1234"
    assert experiments.status({**prefix, "measured_state_sha256": "b"}) == "current"


def test_every_experiment_folder_is_complete():
    for name in NAMES:
        folder = ROOT / "experiments" / name
        assert (folder / "README.md").is_file(), f"{name} has no README.md"
        assert (folder / "run.sh").is_file(), f"{name} has no run.sh"
        prefix = json.loads((folder / "prefix.json").read_text())
        assert prefix["rounds"] and prefix["command"].startswith("fedshift ")
        readme = (folder / "README.md").read_text()
        assert f"<!-- experiment:prefix {name} -->" in readme, f"{name}: README lacks its prefix"


def test_every_script_a_run_sh_names_exists():
    """A moved benchmark script breaks an experiment's command silently until someone re-measures
    it; every ``benchmarks/...`` path a ``run.sh`` names (directly or through ``$bench``) must
    exist."""
    import re

    named = re.compile(r"(?:benchmarks|\$bench)/([\w./-]+\.(?:sh|py))")
    for name in NAMES:
        script = (ROOT / "experiments" / name / "run.sh").read_text()
        for relative in named.findall(script):
            assert (ROOT / "benchmarks" / relative).is_file(), (
                f"experiments/{name}/run.sh names benchmarks/{relative}, which does not exist"
            )


def test_a_file_block_inlines_a_stored_file_of_its_experiment_only(tmp_path, monkeypatch):
    folder = tmp_path / "demo"
    (folder / "runs").mkdir(parents=True)
    (folder / "runs" / "table.md").write_text("| a |\n|---|\n| 1 |\n")
    (tmp_path / "secret.txt").write_text("outside\n")
    monkeypatch.setattr(experiments, "EXPERIMENTS", tmp_path)
    text = "x\n<!-- experiment:file demo runs/table.md -->\nold\n<!-- /experiment -->\ny\n"
    assert experiments.render_text(text) == (
        "x\n<!-- experiment:file demo runs/table.md -->\n| a |\n|---|\n| 1 |\n"
        "<!-- /experiment -->\ny\n"
    )
    for relative in ("../secret.txt", "runs/missing.md"):
        with pytest.raises(experiments.ExperimentError, match="is not a file of the experiment"):
            experiments.render_text(text.replace("runs/table.md", relative))
