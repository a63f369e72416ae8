"""Every file a command writes follows one rule (``fedshift.core.outputs``): a suffix naming
what it writes, never over a file fedshift did not write for that purpose unless ``--force``.

The walk takes every command that has an ``--out`` or ``--plot`` option (read from the parser,
so a new writer must join the table) over the same hostile targets (a run's checkpoint and
config, a user's file with the right suffix, a folder) and checks each is one line, exit 2,
with every file's hash unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from fedshift.cli import build_parser, main
from fedshift.config import resolve
from fedshift.core.outputs import FIGURE_MARK
from fedshift.engine import assembly
from fedshift.engine.run.runner import run_experiment

#: a short run's options (as tests/cli/test_cli_errors.py uses)
TINY = ["--rounds", "1", "--quiet", "--set", "device=cpu", "--set", "threads=1"]
TINY += ["--set", "client_data_fraction=0.05", "--set", "image_size=16"]

#: every writing option of every command, and the command line in front of it; RUN is the run
#: directory of the ``run_dir`` fixture
WRITERS = {
    ("run", "--out"): ["run", *TINY],
    ("sweep", "--out"): ["sweep", "-a", "fedavg", "-t", "optdigits", *TINY],
    ("report", "--plot"): ["report", "RUN"],
    ("datasets show", "--out"): ["datasets", "show"],
    ("plot tsne", "--out"): ["plot", "tsne", "RUN", "--per-client", "3"],
    ("plot curves", "--out"): ["plot", "curves", "RUN"],
    ("pretrain", "--out"): ["pretrain", "--domain", "syn", "--epochs", "1"],
}

#: hostile targets, relative to the test folder
TARGETS = {
    "checkpoint": "RUN/checkpoint.pt",
    "config": "RUN/config.json",
    "user figure": "holiday.png",
    "user weights": "mine.pt",
    "folder": "album.png",
}


def writing_options(parser, prefix: str = "") -> set[tuple[str, str]]:
    """(command, option) for every ``--out``/``--plot`` option under ``parser``."""
    found = set()
    for action in parser._actions:
        if action.option_strings and {"--out", "--plot"} & set(action.option_strings):
            found.add((prefix, next(o for o in action.option_strings if o in ("--out", "--plot"))))
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= writing_options(sub, f"{prefix} {name}".strip())
    return found


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def scene(in_tmp, micro_digits, monkeypatch):
    """A finished 1-round run in RUN, a user's PNG, a user's weights file and a user's folder
    named like a figure (holding a config.json of theirs); every dataset load answers
    ``micro_digits`` (fast)."""
    cfg = resolve(None, {"target": "optdigits"}, ["rounds=1", "device=cpu", "tracking=none"])
    run_experiment(cfg, in_tmp / "RUN", progress=False, dataset=micro_digits)
    Image.new("RGB", (4, 4), "red").save(in_tmp / "holiday.png")
    torch.save({"w": torch.ones(2)}, in_tmp / "mine.pt")
    (in_tmp / "album.png").mkdir()
    (in_tmp / "album.png" / "photo.txt").write_text("mine")
    (in_tmp / "album.png" / "config.json").write_text('{"camera": "mine"}')
    monkeypatch.setattr(assembly, "load_dataset", lambda *a, **k: micro_digits)
    monkeypatch.setattr("fedshift.data.load_dataset", lambda *a, **k: micro_digits)
    return in_tmp


def test_the_table_names_every_writing_option():
    assert writing_options(build_parser()) == set(WRITERS)


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("writer", sorted(WRITERS), ids=" ".join)
def test_no_command_writes_over_a_file_it_did_not_write(scene, capsys, writer, target):
    before = tree_hashes(scene)
    argv = [*WRITERS[writer], writer[1], TARGETS[target]]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert tree_hashes(scene) == before


def test_datasets_show_over_a_checkpoint_is_refused_and_the_checkpoint_kept(scene, capsys):
    checkpoint = scene / "RUN" / "checkpoint.pt"
    digest = hashlib.sha256(checkpoint.read_bytes()).hexdigest()
    assert main(["datasets", "show", "--out", str(checkpoint)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedshift: error: --out ") and "cannot write a figure as '.pt'" in err
    assert hashlib.sha256(checkpoint.read_bytes()).hexdigest() == digest


def test_a_figure_fedshift_wrote_is_replaced_and_force_replaces_a_users(scene, capsys):
    assert main(["plot", "curves", "RUN", "--out", "curves.svg"]) == 0
    assert FIGURE_MARK.encode() in (scene / "curves.svg").read_bytes()
    assert main(["plot", "curves", "RUN", "--out", "curves.svg"]) == 0
    assert main(["plot", "curves", "RUN", "--out", "holiday.png"]) == 2
    assert "holiday.png exists and is not a figure fedshift wrote" in capsys.readouterr().err
    assert main(["plot", "curves", "RUN", "--out", "holiday.png", "--force"]) == 0
    assert FIGURE_MARK.encode() in (scene / "holiday.png").read_bytes()
    assert main(["report", "RUN", "--plot", "c.pdf"]) == 0
    assert main(["report", "RUN", "--plot", "c.pdf"]) == 0
    assert (scene / "c.pdf").read_bytes().startswith(b"%PDF")


def test_pretrain_replaces_its_own_weights_and_refuses_a_foreign_sidecar(scene, capsys):
    argv = ["pretrain", "--domain", "syn", "--epochs", "1", "--out", "bb.pt"]
    assert main(argv) == 0 and main(argv) == 0
    assert json.loads((scene / "bb.pt.json").read_text())["domain"] == "syn"
    (scene / "other.pt.json").write_text('{"mine": 1}')
    assert main([*argv[:-1], "other.pt"]) == 2
    assert "its sidecar other.pt.json exists" in capsys.readouterr().err
    assert (scene / "other.pt.json").read_text() == '{"mine": 1}'
    assert not (scene / "other.pt").exists()
