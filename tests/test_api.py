"""The public Python API: fedshift.run/plan/sweep/load_run and the register_* functions,
checked against the CLI (same keys, same errors), plus --version, --dry-run and show."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

import fedshift
from fedshift.algorithms import BUILTINS, REGISTRY
from fedshift.algorithms.fedavg import FedAvg
from fedshift.cli import main
from fedshift.core.errors import CheckpointError, ConfigError
from fedshift.core.hparams import BaseHparams
from fedshift.data.custom import _REGISTERED
from fedshift.models import FedModel
from fedshift.models.cards import CARDS
from fedshift.models.registry import _FOUND

TINY = {"rounds": 1, "batch_size": 16, "device": "cpu", "threads": 1, "target": "c"}


def tiny_domains(n=40, size=8):
    g = torch.Generator().manual_seed(0)
    domains = {}
    for k, name in enumerate("abc"):
        y = torch.arange(n) % 2
        x = torch.rand(n, 3, size, size, generator=g) * 0.5 + 0.5 * y.view(-1, 1, 1, 1) * k / 2
        domains[name] = (x, y)
    return domains


def build_linear(num_classes, *, in_channels=3, image_size=32):
    """A linear model on flat pixels."""
    backbone = torch.nn.Flatten()
    dim = in_channels * image_size * image_size
    return FedModel(backbone, torch.nn.Linear(dim, num_classes), embed_dim=dim, num_classes=2)


class FedAvgTwice(FedAvg):
    """FedAvg under another name (a script's own algorithm)."""

    name = "fedavg-twice"


@pytest.fixture(autouse=True)
def registered(monkeypatch, tmp_path):
    """A registered tiny dataset; registrations made by a test are undone after it."""
    monkeypatch.chdir(tmp_path)
    fedshift.register_dataset("tiny", tiny_domains)
    cards, found = dict(CARDS), dict(_FOUND)
    algorithms = dict(REGISTRY)
    yield
    _REGISTERED.clear()
    CARDS.clear(), CARDS.update(cards)
    _FOUND.clear(), _FOUND.update(found)
    REGISTRY.clear(), REGISTRY.update(algorithms)


def test_run_returns_summary_history_dir_and_config(tmp_path):
    result = fedshift.run(dataset="tiny", out=tmp_path / "r", **{**TINY, "rounds": 2})
    assert result.finished and result.run_dir == tmp_path / "r"
    assert [row["round"] for row in result.history] == [1, 2]
    assert result.summary["target"] == "c" and 0 <= result.summary["target_accuracy"] <= 1
    assert result.config["dataset"] == "tiny" and result.config["rounds"] == 2
    assert result.metric("round") == [1, 2]
    again = fedshift.load_run(tmp_path / "r")
    assert again.summary == result.summary and again.history == result.history


def test_algo_hyperparameters_as_dict_or_dotted_key(tmp_path):
    one = fedshift.run(dataset="tiny", algorithm="fedprox", algo={"mu": 0.5}, out="a", **TINY)
    two = fedshift.run(dataset="tiny", algorithm="fedprox", out="b", **{"algo.mu": 0.5}, **TINY)
    assert one.config["algo"] == two.config["algo"] == {"mu": 0.5}


@pytest.mark.parametrize(
    ("keys", "argv"),
    [
        ({"learning_rate": 0.1}, ["--set", "learning_rate=0.1"]),
        ({"algorithm": "fedproxx"}, ["-a", "fedproxx"]),
        ({"algorithm": "fedprox", "algo": {"muu": 1}}, ["-a", "fedprox", "--set", "algo.muu=1"]),
        ({"rounds": 0}, ["--rounds", "0"]),
        ({"protocol": "lodoo"}, ["--protocol", "lodoo"]),
    ],
)
def test_same_errors_as_the_cli(keys, argv, capsys):
    with pytest.raises(ConfigError) as raised:
        fedshift.run(**keys)
    assert main(["run", *argv]) == 2
    assert capsys.readouterr().err.strip() == f"fedshift: error: {raised.value}"


def test_register_model_makes_the_name_a_run_key(capsys):
    fedshift.register_model("linear", build_linear, "linear on pixels")
    result = fedshift.run(dataset="tiny", model="linear", out="m", **TINY)
    assert result.config["model"] == "linear"
    assert (
        main(
            [
                "run",
                "-d",
                "tiny",
                "-t",
                "c",
                "--rounds",
                "1",
                "--set",
                "model=linear",
                "--set",
                "device=cpu",
                "--out",
                "cli",
                "--quiet",
            ]
        )
        == 0
    )
    assert main(["list", "models"]) == 0
    assert "linear on pixels" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="built in"):
        fedshift.register_model("cnn", build_linear)


def test_a_model_that_is_not_a_fedmodel_is_refused():
    fedshift.register_model("plain", lambda n, **_: torch.nn.Linear(3, n))
    with pytest.raises(ConfigError, match="not a fedshift.models.FedModel"):
        fedshift.run(dataset="tiny", model="plain", out="p", **TINY)


def test_register_algorithm_runs_and_guards_names():
    assert fedshift.register_algorithm(FedAvgTwice) is FedAvgTwice
    result = fedshift.run(dataset="tiny", algorithm="fedavg-twice", out="t", **TINY)
    assert result.summary["algorithm"] == "fedavg-twice"
    with pytest.raises(ConfigError, match="built in"):
        fedshift.register_algorithm(FedAvgTwice, "fedavg")
    with pytest.raises(ConfigError, match="not a subclass"):
        fedshift.register_algorithm(dict, "nope")
    assert "fedavg" in BUILTINS and "fedavg-twice" not in BUILTINS


def test_in_memory_dataset_and_plan():
    task = fedshift.plan(dataset=tiny_domains(), algorithm="fedavg", **TINY)
    assert task.sources == ["a", "b"] and task.targets == ["c"]
    assert {c["domain"] for c in task.clients} == {"a", "b"}
    assert all(c["train"] == 28 and c["role"] == "source" for c in task.clients)
    result = fedshift.run(dataset=tiny_domains(), out="mem", **TINY)
    assert result.finished


def test_sweep_returns_one_result_per_run(tmp_path):
    results = fedshift.sweep(
        tmp_path / "sw",
        algorithms=["fedavg"],
        targets=["b", "c"],
        seeds=[0],
        dataset="tiny",
        **{k: v for k, v in TINY.items() if k != "target"},
    )
    assert sorted(r.summary["target"] for r in results) == ["b", "c"]
    assert all(len(r.history) == 1 and r.run_dir.parent == tmp_path / "sw" for r in results)


def test_parallel_sweep_refuses_what_only_this_process_registered(tmp_path):
    """Worker processes import fedshift afresh: a registered algorithm or dataset is not
    there, so jobs > 1 says so before any run."""
    fedshift.register_algorithm(FedAvgTwice)
    plan = dict(targets=["c"], dataset="tiny", jobs=2)
    with pytest.raises(ConfigError, match="'fedavg-twice' was registered in this process"):
        fedshift.sweep(tmp_path / "a", algorithms=["fedavg-twice"], **plan)
    with pytest.raises(ConfigError, match="dataset 'tiny' was registered in this process"):
        fedshift.sweep(tmp_path / "d", algorithms=["fedavg"], **plan)
    assert not (tmp_path / "a").exists() and not (tmp_path / "d").exists()


def test_load_run_refuses_a_folder_without_a_run(tmp_path):
    with pytest.raises(CheckpointError, match="not a fedshift run directory"):
        fedshift.load_run(tmp_path)


def test_version_dry_run_and_show(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert (
        done.value.code == 0
        and capsys.readouterr().out.strip() == f"fedshift {fedshift.__version__}"
    )
    assert (
        main(
            [
                "run",
                "-d",
                "tiny",
                "-t",
                "c",
                "--dry-run",
                "--device",
                "cpu",
                "--clients-per-domain",
                "2",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert 'dataset = "tiny"' in out and "# task: 4 clients; sources a, b; targets c" in out
    assert ["1", "a-1", "a", "source", "14", "2", "4"] in [
        line.split() for line in out.splitlines()
    ]
    assert not Path("runs").exists()
    assert main(["show", "fedprox"]) == 0
    out = capsys.readouterr().out
    assert "algo.mu  float  0.01" in out and "μ weight of the proximal term" in out
    assert "protocols:  lodo, personalized, msst, per-domain" in out
    assert main(["show", "fedproxx"]) == 2
    assert "did you mean 'fedprox'" in capsys.readouterr().err


def test_help_lists_every_protocol(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # no line wrapped inside a word
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "lodo, personalized, msst, per-domain (default lodo)" in text
    assert "(default 30)" in text


@dataclasses.dataclass(frozen=True)
class SymbolHparams(BaseHparams):
    tau: float = dataclasses.field(default=0.5, metadata={"symbol": "τ", "help": "temperature"})


class WithSymbols(FedAvg):
    """FedAvg with a documented hyperparameter."""

    name = "with-symbols"
    Hparams = SymbolHparams


def test_show_prints_field_metadata_and_origin(capsys):
    fedshift.register_algorithm(WithSymbols)
    assert main(["show", "with-symbols"]) == 0
    out = capsys.readouterr().out
    assert "[registered]" in out and "algo.tau  float  0.5      τ temperature" in out
