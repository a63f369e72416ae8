"""Command-line behaviour: errors are one line, exit code 2, and write nothing."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import fedshift
from fedshift.cli import main
from fedshift.core.errors import (
    CheckpointError,
    ConfigError,
    DatasetError,
    FedshiftError,
    ModelError,
    RoundFailed,
    StorageError,
)
from fedshift.core.runfiles import MARKER_NAME
from fedshift.data.catalog import CATALOG


@pytest.mark.parametrize(
    "argv,expected",
    [
        (
            ["run", "-a", "fedsgd"],
            "unknown algorithm 'fedsgd' (did you mean 'fedsr'?); choose one of: fedavg",
        ),
        (["run", "-d", "nope"], "nope"),
        (["run", "-d", "pacss"], "unknown dataset 'pacss' (did you mean 'pacs'?); catalog"),
        (["run", "-t", "svhn"], "unknown target domain 'svhn' for digits-dg; choose one of: mn"),
        (["run", "--set", "learning_rate=0.1"], "unknown config key 'learning_rate'"),
        (
            ["run", "--set", "algo.mu=0.1"],
            "unknown hyperparameter 'algo.mu' for algorithm 'fedavg'",
        ),
        (["run", "-a", "fedprox", "--set", "algo.mu=x"], "algo.mu expects float"),
        (["run", "-t", "mnist", "-s", "mnist,syn"], "target domain 'mnist' is also a source"),
        (["run", "-s", "mnist,usps"], "unknown source domain 'usps'"),
        (["run", "--protocol", "xyz"], "unknown protocol 'xyz'; choose one of: lodo"),
        (["run", "--rounds", "0"], "rounds must be >= 1"),
        (["run", "--clients-per-domain", "100000"], "clients"),
        (["run", "--device", "tpu"], "unknown device 'tpu'"),
        (["run", "--resume", "--out", "missing-run"], "no checkpoint.pt in missing-run"),
        (["run", "--config", "missing.toml"], "config file missing.toml does not exist"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(in_tmp, capsys, argv, expected):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("fedshift: error: "), err
    assert expected in err[0]
    assert not (in_tmp / "runs").exists()


def test_unknown_subcommand_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2


def test_list_algorithms_shows_what_each_shares(capsys):
    assert main(["list", "algorithms"]) == 0
    out = capsys.readouterr().out
    for name in ("fedavg", "fedprox", "local", "centralized"):
        assert name in out
    assert "model:model" in out and "nothing" in out


def test_list_datasets(in_tmp, capsys):
    assert main(["list", "datasets"]) == 0
    out = capsys.readouterr().out
    assert "digits-dg" in out and "mnistm" in out and "optdigits" in out


def test_both_dataset_listings_print_the_catalog_built_in_registered_and_folder(capsys):
    fedshift.register_dataset("cli-listed", lambda: {}, "a test's own set")
    assert main(["list", "datasets"]) == 0
    listed = capsys.readouterr().out
    assert main(["datasets", "list"]) == 0
    assert capsys.readouterr().out == listed
    for entry in CATALOG.values():
        assert f"{entry.name}  [{entry.resolution} px]  {entry.source}" in listed
        command = re.search(rf"runs:    fedshift run -d {re.escape(entry.name)} (.*)", listed)
        assert command and command.group(1).endswith("--set data_root=PATH"), entry.name
    assert "digits-dg  [32 px]  built in" in listed
    assert "cli-listed  registered: a test's own set" in listed
    assert "PATH  [64 px]" in listed


def test_run_help_gives_every_catalog_entry_its_resolution(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # no line wrapped inside a name
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    named = {
        name: int(size)
        for size, names in re.findall(r"(\d+) px: ([^;)]*)", text)
        for name in names.split(", ")
    }
    assert named == {name: entry.resolution for name, entry in CATALOG.items()}
    assert "digits-dg is built in (32 px)" in text


def test_every_user_error_is_a_fedshift_error_of_its_old_kind():
    for kind, builtin in [
        (ConfigError, ValueError),
        (DatasetError, ValueError),
        (ModelError, ValueError),
        (CheckpointError, RuntimeError),
        (RoundFailed, RuntimeError),
    ]:
        assert issubclass(kind, FedshiftError) and issubclass(kind, builtin)
    full = StorageError("disk full", "run/summary.json")
    assert isinstance(full, FedshiftError) and isinstance(full, OSError)


def test_pretrain_refuses_a_non_positive_learning_rate(capsys):
    assert main(["pretrain", "--domain", "syn", "--out", "w.pt", "--lr", "-1"]) == 2
    assert capsys.readouterr().err == "fedshift: error: lr must be > 0, got -1.0\n"


def test_pretrain_takes_data_root_as_its_error_asks(tmp_path, capsys):
    """``pretrain -d pacs`` asks for ``--set data_root=PATH``, and takes it as a run does."""
    argv = ["pretrain", "-d", "pacs", "--domain", "photo", "--out", str(tmp_path / "w.pt")]
    assert main(argv) == 2
    assert "give --set data_root=PATH" in capsys.readouterr().err
    assert main([*argv, "--set", f"data_root={tmp_path / 'nope'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedshift: error: dataset root {tmp_path / 'nope'} does not exist")
    assert not (tmp_path / "w.pt").exists()


def test_python_m_fedshift_cli_runs_the_command():
    done = subprocess.run(
        [sys.executable, "-m", "fedshift.cli", "--version"], capture_output=True, text=True
    )
    assert done.returncode == 0 and done.stdout.startswith("fedshift "), done.stderr


def test_toml_config_and_set_override(in_tmp, capsys):
    (in_tmp / "exp.toml").write_text(
        'algorithm = "fedprox"\nrounds = 1\ntarget = "optdigits"\nclient_data_fraction = 0.05\n'
        "[algo]\nmu = 0.5\n"
    )
    code = main(
        [
            "run",
            "--config",
            "exp.toml",
            "--set",
            "algo.mu=0.25",
            "--quiet",
            "--set",
            "device=cpu",
            "--out",
            "r",
        ]
    )
    assert code == 0, capsys.readouterr().err
    config = json.loads((in_tmp / "r" / "config.json").read_text())
    assert config["algorithm"] == "fedprox" and config["algo"] == {"mu": 0.25}
    summary = json.loads((in_tmp / "r" / "summary.json").read_text())
    for key in (
        "target_accuracy",
        "target_accuracy_last",
        "per_domain_accuracy",
        "bytes_up",
        "bytes_down",
        "wall_seconds",
        "samples_per_second",
        "algorithm",
        "dataset",
        "target",
        "seed",
        "rounds",
        "protocol",
    ):
        assert key in summary
    assert summary["target"] == "optdigits" and summary["rounds"] == 1
    assert "target accuracy" in capsys.readouterr().out
    # the same --out again without --resume is refused, and the run is untouched
    assert main(["run", "--config", "exp.toml", "--quiet", "--out", "r"]) == 2
    assert json.loads((in_tmp / "r" / "summary.json").read_text()) == summary


def test_corrupt_checkpoint_is_a_clear_error(in_tmp, capsys):
    run_dir = in_tmp / "broken"
    run_dir.mkdir()
    (run_dir / MARKER_NAME).write_text("")  # a run's folder (a folder without it is refused)
    (run_dir / "checkpoint.pt").write_bytes(b"not a checkpoint")
    assert main(["run", "--resume", "--out", str(run_dir), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "corrupt or not a fedshift checkpoint" in err
    assert (run_dir / "checkpoint.pt").read_bytes() == b"not a checkpoint"


def test_printed_run_commands_of_one_domain_and_writer_sets_run(tmp_path, capsys):
    """``datasets list``'s run command for CIFAR-10/100 (one domain: personalized clients by
    label skew) and FEMNIST (writers found in the copy: per domain) runs as printed on a
    copy in the official layout; before, all three stopped at the default target mnistm."""
    import shlex

    import test_catalog_cifar as cifar
    import test_femnist as femnist

    roots = {"cifar10": tmp_path / "c10", "cifar100": tmp_path / "c100"}
    folder = roots["cifar10"] / "cifar-10-batches-bin"
    serial = 0
    for i in range(1, 6):
        serial = cifar._write(folder / f"data_batch_{i}.bin", list(range(10)) * 10, serial, False)
    cifar._write(folder / "test_batch.bin", list(range(10)) * 20, serial, False)
    folder = roots["cifar100"] / "cifar-100-binary"
    serial = cifar._write(folder / "train.bin", list(range(100)) * 10, 0, True)
    cifar._write(folder / "test.bin", list(range(100)) * 10, serial, True)
    roots["femnist"] = femnist._tree(tmp_path / "leaf")
    assert main(["datasets", "list"]) == 0
    listed = capsys.readouterr().out
    for name, root in roots.items():
        printed = re.search(rf"runs:    (fedshift run -d {name} .*)", listed).group(1)
        argv = shlex.split(printed.replace("data_root=PATH", f"data_root={root}"))[1:]
        assert main([*argv, "--dry-run"]) == 0, printed
