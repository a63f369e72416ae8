"""No command imports code that a run directory's ``config.json`` names (issue 34 item 2).

Every command of the CLI (read from the parser, so a new one must join the table) and every
Python API loader is run on a finished run whose ``config.json`` was edited to name a planted
module for ``algorithm`` or ``model``; an audit hook records which of them read that file.
None may import the module; those that rebuild the run's model or algorithm refuse in one
line naming ``--allow-imports``, as ``run --resume`` always did.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

import fedshift
from fedshift.cli import build_parser, main
from fedshift.config import ALLOW_IMPORTS_ENV, resolve
from fedshift.core.errors import ConfigError
from fedshift.engine import assembly
from fedshift.engine.run.runner import run_experiment
from fedshift.report import tsne

PLANTED = """
from pathlib import Path
Path(__file__).with_name("IMPORTED").write_text("planted module ran")
X = 1
"""
#: the paths of every config.json opened while ``_recording`` is on
_opened: list[str] = []
_recording: list[bool] = []


def _audit(event: str, args: tuple) -> None:
    if _recording and event == "open" and isinstance(args[0], str | Path):
        if str(args[0]).endswith("config.json"):
            _opened.append(str(args[0]))


_hooked: list[bool] = []

#: each CLI command (leaf of the parser) and what it is given; RUN is the planted run
COMMANDS = {
    "run": ["run", "--out", "RUN", "--resume", "--quiet"],
    "sweep": ["sweep", "-a", "fedavg", "-t", "optdigits", "--rounds", "1", "--out", "sw"],
    "report": ["report", "RUN", "--plot", "r.png"],
    "list": ["list", "algorithms"],
    "show": ["show", "fedavg"],
    "datasets list": ["datasets", "list"],
    "datasets check": ["datasets", "check", "pacs", "--root", "nowhere"],
    "datasets show": ["datasets", "show", "--out", "grid.png"],
    "plot tsne": ["plot", "tsne", "RUN", "--per-client", "3", "--out", "t.png"],
    "plot curves": ["plot", "curves", "RUN", "--out", "c.png"],
    "pretrain": ["pretrain", "--domain", "syn", "--epochs", "1", "--out", "bb.pt"],
}
#: the Python API's loaders of a run directory
LOADERS = {
    "fedshift.load_run": lambda run: fedshift.load_run(run),
    "fedshift.run(resume=True)": lambda run: fedshift.run(out=run, resume=True),
    "report.tsne.load_run": lambda run: tsne.load_run(run),
}
#: those that rebuild the run's model or algorithm from config.json (the rest only read it)
REBUILDERS = {"run", "plot tsne", "fedshift.run(resume=True)", "report.tsne.load_run"}


def leaf_commands(parser, prefix: str = "") -> set[str]:
    """Every command the parser runs (``datasets show``, ``run``, ...)."""
    found = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                below = leaf_commands(sub, f"{prefix} {name}".strip())
                found |= below or {f"{prefix} {name}".strip()}
    return found


@pytest.fixture
def planted_run(in_tmp, micro_digits, monkeypatch, request):
    """A finished 1-round run in RUN whose config.json then names ``planted:X``, the module
    beside it on sys.path; every dataset load answers ``micro_digits``."""
    monkeypatch.delenv(ALLOW_IMPORTS_ENV, raising=False)
    cfg = resolve(None, {"target": "optdigits"}, ["rounds=1", "device=cpu", "tracking=none"])
    run_experiment(cfg, in_tmp / "RUN", progress=False, dataset=micro_digits)
    config = in_tmp / "RUN" / "config.json"
    saved = json.loads(config.read_text())
    saved[request.param] = "planted:X"
    config.write_text(json.dumps(saved))
    (in_tmp / "planted.py").write_text(PLANTED)
    monkeypatch.syspath_prepend(str(in_tmp))
    monkeypatch.setattr(assembly, "load_dataset", lambda *a, **k: micro_digits)
    monkeypatch.setattr("fedshift.data.load_dataset", lambda *a, **k: micro_digits)
    if not _hooked:
        sys.addaudithook(_audit)
        _hooked.append(True)
    yield in_tmp
    sys.modules.pop("planted", None)


def test_the_table_names_every_command():
    assert leaf_commands(build_parser()) == set(COMMANDS)


@pytest.mark.parametrize("planted_run", ["algorithm", "model"], indirect=True)
def test_no_command_or_loader_imports_what_a_saved_config_names(planted_run, capsys):
    readers, answers = set(), {}
    commands = {k: lambda _run, a=argv: main(list(a)) for k, argv in COMMANDS.items()}
    for name, call in {**commands, **LOADERS}.items():
        _opened.clear()
        _recording.append(True)
        try:
            answers[name] = call(planted_run / "RUN")
        except ConfigError as exc:
            answers[name] = str(exc)
        finally:
            _recording.clear()
        err = capsys.readouterr().err
        if any(Path(p).resolve() == planted_run / "RUN" / "config.json" for p in _opened):
            readers.add(name)
        assert not (planted_run / "IMPORTED").exists(), name
        assert "planted" not in sys.modules, name
        if name in REBUILDERS:
            said = err if name in COMMANDS else answers[name]
            assert answers[name] == 2 or name in LOADERS, (name, err)
            assert "'planted:X', an import path" in said and "--allow-imports" in said, said
    assert REBUILDERS <= readers, readers
    assert {"report", "plot curves", "fedshift.load_run"} <= readers, readers


@pytest.mark.parametrize("planted_run", ["model"], indirect=True)
def test_plot_tsne_with_allow_imports_imports_it(planted_run, capsys):
    argv = ["plot", "tsne", "RUN", "--per-client", "3", "--out", "t.png", "--allow-imports"]
    assert main(argv) == 2
    assert (planted_run / "IMPORTED").exists()
    assert "model 'planted:X' is 1, not a callable model builder" in capsys.readouterr().err
