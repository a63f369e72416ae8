"""Plug-ins: entry points (faked here; CI installs examples/plugin for real) and import paths
``package.module:attribute`` for algorithms, models and datasets; a broken one is one line."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from importlib.metadata import EntryPoint

import pytest

from fedshift import plugins
from fedshift.algorithms import REGISTRY
from fedshift.cli import main
from fedshift.models.cards import CARDS
from fedshift.models.registry import _FOUND

PLUGIN = textwrap.dedent(
    '''
    import torch
    from fedshift.algorithms.fedavg import FedAvg
    from fedshift.models import FedModel

    class MyAvg(FedAvg):
        """FedAvg from a plug-in."""
        name = "my-avg"
        paper = "a plug-in"

    def build_flat(num_classes, *, in_channels=3, image_size=32):
        """Linear model on flat pixels."""
        dim = in_channels * image_size * image_size
        return FedModel(torch.nn.Flatten(), torch.nn.Linear(dim, num_classes),
                        embed_dim=dim, num_classes=num_classes)

    def three_domains():
        g = torch.Generator().manual_seed(0)
        y = torch.arange(30) % 3
        return {d: (torch.rand(30, 1, 8, 8, generator=g), y) for d in ("p", "q", "r")}

    NOT_AN_ALGORITHM = 42
    '''
)
ENTRY_POINTS = [
    ("fedshift.algorithms", "my-avg", "fs_test_plugin:MyAvg"),
    ("fedshift.algorithms", "broken-algo", "fs_test_broken:Anything"),
    ("fedshift.algorithms", "wrong-algo", "fs_test_plugin:NOT_AN_ALGORITHM"),
    ("fedshift.models", "flat", "fs_test_plugin:build_flat"),
    ("fedshift.datasets", "three", "fs_test_plugin:three_domains"),
]
TINY = ["--rounds", "1", "--set", "threads=1", "--device", "cpu", "--quiet"]


@pytest.fixture(autouse=True)
def plugin_package(tmp_path, monkeypatch):
    """A module on sys.path and fake entry points naming it (as an installed package's)."""
    (tmp_path / "fs_test_plugin.py").write_text(PLUGIN)
    (tmp_path / "fs_test_broken.py").write_text("raise RuntimeError('plug-in bug')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    fake = [EntryPoint(name, value, group) for group, name, value in ENTRY_POINTS]
    monkeypatch.setattr(
        plugins, "entry_points", lambda group: [p for p in fake if p.group == group]
    )
    plugins.refresh()
    algorithms, cards, found = dict(REGISTRY), dict(CARDS), dict(_FOUND)
    yield
    plugins.refresh()
    REGISTRY.clear(), REGISTRY.update(algorithms)
    CARDS.clear(), CARDS.update(cards)
    _FOUND.clear(), _FOUND.update(found)
    for name in ("fs_test_plugin", "fs_test_broken"):
        sys.modules.pop(name, None)


def test_entry_point_plugins_run_from_the_cli(capsys):
    argv = ["run", "-a", "my-avg", "--model", "flat", "-d", "three", "-t", "r", "--out", "a"]
    assert main(argv + TINY) == 0
    out = capsys.readouterr().out
    assert "my-avg on three (lodo), target r" in out


def test_import_paths_run_from_the_cli(capsys):
    argv = [
        "run",
        "-a",
        "fs_test_plugin:MyAvg",
        "--model",
        "fs_test_plugin:build_flat",
        "-d",
        "three",
        "-t",
        "p",
        "--out",
        "b",
    ]
    assert main(argv + TINY) == 0


def test_list_marks_plugins_and_warns_about_broken_ones(capsys, caplog):
    assert main(["list", "algorithms"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "plug-in" in rows["my-avg"] and "built-in" in rows["fedavg"]
    assert "broken-algo" not in rows and "wrong-algo" not in rows
    messages = [r.getMessage() for r in caplog.records]
    assert any("'broken-algo'" in m and "RuntimeError: plug-in bug" in m for m in messages)
    assert all("\n" not in m for m in messages)
    assert main(["list", "models"]) == 0
    assert "Linear model on flat pixels" in capsys.readouterr().out
    assert main(["list", "datasets"]) == 0
    assert "three" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["-a", "broken-algo"],
            "algorithm plug-in 'broken-algo' from ? "
            "(fs_test_broken:Anything) failed to load: RuntimeError: plug-in bug",
        ),
        (["-a", "wrong-algo"], "is 42, not a subclass of fedshift.core.algorithm.Algorithm"),
        (["-a", "fs_test_plugin:Missing"], "module 'fs_test_plugin' has no 'Missing'"),
        (["-a", "no_such_module:X"], "cannot import 'no_such_module'"),
        (["--model", "fs_test_plugin:NOT_AN_ALGORITHM"], "not a callable model builder"),
        (["--model", "fs_test_broken:f"], "RuntimeError: plug-in bug"),
    ],
)
def test_a_broken_plugin_is_one_line(argv, message, capsys):
    assert main(["run", *argv, "-d", "three", "-t", "r", "--out", "x", *TINY]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedshift: error: ") and message in err
    assert "Traceback" not in err


@pytest.mark.skipif(
    importlib.util.find_spec("fedshift_example_plugin") is None,
    reason="examples/plugin is not installed (CI installs it: pip install examples/plugin)",
)
def test_the_installed_example_plugin_is_found(monkeypatch):
    monkeypatch.undo()  # the real entry points
    plugins.refresh()
    assert {"fedprox-l1"} <= set(plugins.plugin_names("algorithm"))
    assert {"tiny-mlp"} <= set(plugins.plugin_names("model"))
    assert {"stripes"} <= set(plugins.plugin_names("dataset"))
    assert REGISTRY["fedprox-l1"].Hparams().lam == 1e-4
