"""Every everyday mistake on the command line ends in one line and an exit code, never a
traceback: ``fedshift: error: ...`` and exit 2, or ``fedshift: interrupted; ...`` and 130.

Each case drives :func:`fedshift.cli.main` in-process and checks the exit code, that stderr
is exactly one line, that it says what is wrong, and that no traceback was printed.
"""

from __future__ import annotations

import errno
import json
import os

import pytest

from fedshift.algorithms.fedavg import FedAvg
from fedshift.cli import main
from fedshift.core.errors import DatasetError, RoundFailed
from fedshift.core.runfiles import MARKER_NAME
from fedshift.engine.run import runner as runner_module

TINY = ["--rounds", "1", "--quiet", "--set", "client_data_fraction=0.05"]
#: 16 px digits: these runs check files, errors and resumes, not accuracy, and scoring the full
#: test splits at 32 px cost most of each round
TINY += ["--set", "device=cpu", "--set", "threads=1", "--set", "image_size=16"]


def one_line(capsys, code: int, argv: list[str], expected: str, exit_code: int = 2) -> str:
    """Run ``main(argv)`` and check it answered ``expected`` in one stderr line."""
    got = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err, err
    assert got == exit_code, err
    assert len(lines) == 1, lines
    assert expected in lines[0], lines[0]
    return lines[0]


#: inputs refused while resolving the config, before any data is touched
CONFIG_CASES = [
    (["run", "--resume"], "--resume needs --out RUN_DIR"),
    (["run", "--set", "lr=nan"], "lr must be a finite number, got nan"),
    (["run", "--set", "lr=inf"], "lr must be a finite number, got inf"),
    (["run", "--set", "lr=-0.1"], "lr must be > 0, got -0.1"),
    (["run", "--set", "momentum=nan"], "momentum must be a finite number"),
    (["run", "--set", "momentum=-inf"], "momentum must be a finite number"),
    (["run", "--set", "momentum=-0.5"], "momentum must be >= 0, got -0.5"),
    (["run", "--set", "weight_decay=inf"], "weight_decay must be a finite number"),
    (["run", "--set", "weight_decay=-1e-4"], "weight_decay must be >= 0, got -0.0001"),
    (["run", "--set", "dirichlet_alpha=nan"], "dirichlet_alpha must be a finite number"),
    (["run", "--set", "fraction=nan"], "fraction must be a finite number"),
    (["run", "-s", ""], "--sources '' names no domain"),
    (["run", "-s", ","], "--sources ',' names no domain"),
    (["run", "--set", "sources=,"], "sources ',' names no domain"),
    (
        ["run", "--set", "local_epoch=2"],
        "unknown config key 'local_epoch' (did you mean 'local_epochs'?)",
    ),
    (
        ["run", "--set", "local-epochs=2"],
        "unknown config key 'local-epochs' (did you mean 'local_epochs'?)",
    ),
    (["run", "--set", "roundz=2"], "(did you mean 'rounds'?)"),
    (["run", "--set", "learning_rate=0.1"], "'learning_rate' (did you mean 'lr'?)"),
    (["run", "-a", "FedAvg"], "unknown algorithm 'FedAvg' (did you mean 'fedavg'?)"),
    (["run", "--set", "failure_polcy=strict"], "(did you mean 'failure_policy'?)"),
    (["run", "-a", "fedprx"], "unknown algorithm 'fedprx' (did you mean 'fedprox'?)"),
    (["run", "--protocol", "lodoo"], "unknown protocol 'lodoo' (did you mean 'lodo'?)"),
    (["run", "--set", "optimizer=adamw"], "unknown optimizer 'adamw' (did you mean 'adam'?)"),
    (
        ["run", "-a", "fedprox", "--set", "algo.m=0.1"],
        "'algo.m' for algorithm 'fedprox' (did you mean 'algo.mu'?)",
    ),
    (["run", "-a", "moon", "--set", "algo.temprature=1"], "(did you mean 'algo.temperature'?)"),
    # range checks of the algorithms' hyperparameters
    (["run", "-a", "fedprox", "--set", "algo.mu=-1"], "algo.mu must be >= 0, got -1.0"),
    (["run", "-a", "fedprox", "--set", "algo.mu=nan"], "algo.mu must be a finite number"),
    (
        ["run", "-a", "ditto", "--protocol", "personalized", "--set", "algo.lam=-2"],
        "algo.lam must be >= 0",
    ),
    (
        ["run", "-a", "fedproto", "--protocol", "personalized", "--set", "algo.proto_weight=inf"],
        "algo.proto_weight must be a finite number",
    ),
    (["run", "-a", "moon", "--set", "algo.temperature=0"], "algo.temperature must be > 0"),
    (
        ["run", "-a", "fpl", "--protocol", "per-domain", "--set", "algo.temperature=-1"],
        "algo.temperature must be > 0",
    ),
    (["run", "-a", "fedsr", "--set", "algo.alpha_cmi=-1"], "algo.alpha_cmi must be >= 0"),
    (["run", "-a", "ccst", "--set", "algo.alpha=1.5"], "algo.alpha must be in [0, 1]"),
    (["run", "-a", "feddg-elcfs", "--set", "algo.temperature=0"], "algo.temperature must be > 0"),
    (["run", "-a", "feddg-elcfs", "--set", "algo.meta_step=-1e-3"], "algo.meta_step must be > 0"),
    (["run", "-a", "fedga", "--set", "algo.step=1.5"], "algo.step must be in (0, 1), got 1.5"),
    (["run", "-a", "fedadg", "--set", "algo.ce_weight=2"], "algo.ce_weight must be in [0, 1]"),
    (["run", "-a", "fedadg", "--set", "algo.label_value=0"], "algo.label_value must be > 0"),
    (
        ["run", "-a", "fada", "--protocol", "msst", "--set", "algo.mi_weight=-1"],
        "algo.mi_weight must be >= 0",
    ),
    (["run", "-a", "fact", "--protocol", "msst", "--set", "algo.lr=-0.1"], "algo.lr must be > 0"),
    (
        ["run", "-a", "bd-fedproto", "--protocol", "personalized", "--set", "algo.beta=-1"],
        "algo.beta must be >= 0",
    ),
    (
        ["run", "-a", "perada", "--protocol", "personalized", "--set", "algo.kd_lr=0"],
        "algo.kd_lr must be > 0",
    ),
]


@pytest.mark.parametrize("argv,expected", CONFIG_CASES)
def test_bad_values_and_misspelled_keys_are_one_line(in_tmp, capsys, argv, expected):
    one_line(capsys, 2, argv, expected)
    assert not (in_tmp / "runs").exists()


@pytest.mark.parametrize(
    "text,expected",
    [
        ("lokal_epochs = 2\n", "unknown config key 'lokal_epochs' (did you mean 'local_epochs'?)"),
        ("local-epochs = 2\n", "(did you mean 'local_epochs'?)"),
        ("[alog]\nmu = 0.1\n", "unknown table [alog] in the config file (did you mean 'algo'?)"),
        ('algorithm = "fedprox"\n[algo]\nmuu = 0.1\n', "(did you mean 'algo.mu'?)"),
        ("lr = nan\n", "lr must be a finite number"),
        ("rounds = 2\nrounds = 3\n", "is not valid TOML"),
    ],
)
def test_misspelled_keys_in_a_toml_file(in_tmp, capsys, text, expected):
    (in_tmp / "exp.toml").write_text(text)
    one_line(capsys, 2, ["run", "--config", "exp.toml"], expected)


def test_out_pointing_at_a_file(in_tmp, capsys):
    (in_tmp / "notes.txt").write_text("mine")
    one_line(capsys, 2, ["run", *TINY, "--out", "notes.txt"], "is a file, not a folder")
    one_line(capsys, 2, ["run", *TINY, "--out", "notes.txt/run"], "is a file, not a folder")
    assert (in_tmp / "notes.txt").read_text() == "mine"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_out_in_a_read_only_folder(in_tmp, capsys):
    locked = in_tmp / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        one_line(capsys, 2, ["run", *TINY, "--out", "locked/run"], "cannot be written")
    finally:
        locked.chmod(0o755)


def test_out_in_a_place_the_system_refuses(in_tmp, capsys):
    """A folder the kernel will not create even for root (sysfs): one line, not OSError."""
    try:
        os.mkdir("/sys/fedshift-probe")
    except OSError:
        pass
    else:  # pragma: no cover - a writable /sys: nothing to test here
        os.rmdir("/sys/fedshift-probe")
        pytest.skip("/sys is writable here")
    one_line(capsys, 2, ["run", *TINY, "--out", "/sys/fedshift-run"], "/sys/fedshift-run")


def test_non_empty_out_is_refused_without_leaving_a_lock(in_tmp, capsys):
    mine = in_tmp / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("x")
    one_line(capsys, 2, ["run", *TINY, "--out", "mine"], "is not empty")
    one_line(capsys, 2, ["run", *TINY, "--out", "mine", "--resume"], "no checkpoint.pt in mine")
    assert sorted(p.name for p in mine.iterdir()) == ["thesis.tex"]


def test_report_plot_into_a_missing_folder_and_unknown_metric(in_tmp, capsys):
    run = in_tmp / "runs" / "r"
    run.mkdir(parents=True)
    summary = {"algorithm": "fedavg", "target": "mnistm", "seed": 0, "target_accuracy": 0.5}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "target_accuracy": 0.5}) + "\n")
    one_line(
        capsys, 2, ["report", "runs", "--plot", "nowhere/curves.png"], "nowhere does not exist"
    )
    line = one_line(capsys, 2, ["report", "runs", "--metric", "target_acc"], "unknown --metric")
    assert "(did you mean 'target_accuracy'?)" in line and "have: target_accuracy" in line
    one_line(capsys, 2, ["report", "missing-folder"], "missing-folder does not exist")
    assert main(["report", "runs", "--plot", "curves.png"]) == 0
    assert (in_tmp / "curves.png").is_file()


def interrupt_in_round(monkeypatch, when: int, error: BaseException) -> None:
    """Make FedAvg's round ``when`` raise ``error`` (Ctrl-C, a failed round)."""
    original = FedAvg.round

    def round_(self, state, fed):
        if fed.round == when:
            raise error
        return original(self, state, fed)

    monkeypatch.setattr(FedAvg, "round", round_)


def test_ctrl_c_says_how_to_resume_and_the_resume_finishes(in_tmp, capsys, monkeypatch):
    argv = ["run", *TINY, "--rounds", "2", "--out", "r"]
    with monkeypatch.context() as patch:
        interrupt_in_round(patch, 2, KeyboardInterrupt())
        line = one_line(capsys, 130, argv, "fedshift: interrupted; continue it with", 130)
    assert line.endswith("fedshift run --out r --resume")
    assert main(["run", "--out", "r", "--resume", "--quiet"]) == 0
    assert json.loads((in_tmp / "r" / "summary.json").read_text())["rounds"] == 2


def test_a_run_that_failed_before_its_first_checkpoint_starts_again(in_tmp, capsys, monkeypatch):
    argv = ["run", *TINY, "--out", "r"]
    with monkeypatch.context() as patch:
        interrupt_in_round(patch, 1, KeyboardInterrupt())
        line = one_line(capsys, 130, argv, "nothing was saved; start it again with", 130)
    assert "--out r" in line and not (in_tmp / "r" / "checkpoint.pt").exists()
    assert main(argv) == 0, capsys.readouterr().err  # the same command again just runs
    assert (in_tmp / "r" / "summary.json").is_file()


def test_a_failed_round_is_one_line(in_tmp, capsys, monkeypatch):
    with monkeypatch.context() as patch:
        interrupt_in_round(patch, 1, RoundFailed("round 1: 0 of 3 clients replied"))
        one_line(capsys, 2, ["run", *TINY, "--out", "r"], "round 1: 0 of 3 clients replied")
    assert main(["run", *TINY, "--out", "r"]) == 0  # and the folder can be used again


def test_dataset_error_is_one_line(in_tmp, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise DatasetError("domain 'mnist' has no test split")

    monkeypatch.setattr(runner_module, "prepare", broken)
    one_line(capsys, 2, ["run", *TINY, "--out", "r"], "domain 'mnist' has no test split")


def test_a_full_disk_is_one_line_and_leaves_no_temp_file(in_tmp, capsys, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    argv = ["run", *TINY, "--rounds", "2", "--out", "r"]
    with monkeypatch.context() as patch:  # the disk is full from the start
        patch.setattr(os, "write", full)
        line = one_line(capsys, 2, argv, "cannot write r/config.json: No space left on device")
    assert line.endswith("then run the same command again")
    assert not (in_tmp / "r").exists()  # nothing was written: the run leaves no folder
    original = FedAvg.round

    with monkeypatch.context() as patch:  # the disk fills up during round 2

        def fill_disk_in_round_2(self, state, fed):
            if fed.round == 2:
                patch.setattr(os, "write", full)
            return original(self, state, fed)

        patch.setattr(FedAvg, "round", fill_disk_in_round_2)
        line = one_line(capsys, 2, argv, "cannot write r/checkpoint.pt: No space left on device")
    assert line.endswith("then continue with: fedshift run --out r --resume")
    assert not [p.name for p in (in_tmp / "r").iterdir() if p.name.endswith(".tmp")]
    assert main(["run", "--out", "r", "--resume", "--quiet"]) == 0  # as the line says


def test_resume_with_a_contradicting_flag_names_the_key(in_tmp, capsys):
    assert main(["run", *TINY, "--out", "r"]) == 0
    capsys.readouterr()
    line = one_line(
        capsys, 2, ["run", "--out", "r", "--resume", "--set", "lr=0.5"], "cannot change lr"
    )
    assert "saved 0.01, given 0.5" in line
    one_line(
        capsys, 2, ["run", "--out", "r", "--resume", "-a", "fedprox"], "cannot change algorithm"
    )
    one_line(capsys, 2, ["run", "--out", "r", "--resume", "--rounds", "0"], "rounds")


def test_corrupt_checkpoint_without_a_previous_one_is_one_line(in_tmp, capsys):
    run_dir = in_tmp / "broken"
    run_dir.mkdir()
    (run_dir / MARKER_NAME).write_text("")  # a run's folder (a folder without it is refused)
    (run_dir / "config.json").write_text(json.dumps({"algorithm": "fedavg", "rounds": 1}))
    (run_dir / "checkpoint.pt").write_bytes(
        b"PK\x03\x04xx\nFEDSHIFT-CKPT sha256=" + b"0" * 64 + b"\n"
    )
    one_line(capsys, 2, ["run", "--resume", "--out", "broken", "--quiet"], "is corrupt")


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["rnu"], "invalid choice: 'rnu'"),
        (["list", "algoritms"], "(did you mean 'algorithms'?)"),
        (["run", "--rounds", "x"], "argument --rounds: invalid int value: 'x'"),
        (["run", "--bogus"], "unrecognized arguments: --bogus"),
        (["report", "runs", "--format", "xml"], "argument --format: invalid choice: 'xml'"),
        (["sweep", "-a", "fedavg"], "the following arguments are required"),
    ],
)
def test_argument_errors_are_one_line(in_tmp, capsys, argv, expected):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert info.value.code == 2 and "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith("fedshift: error: ") and expected in lines[0]


def test_sweep_errors_are_one_line(in_tmp, capsys):
    (in_tmp / "notes.txt").write_text("mine")
    sweep = ["sweep", "-t", "optdigits", "--rounds", "1", "--quiet"]
    one_line(capsys, 2, [*sweep, "-a", "fedprx", "--out", "sw"], "(did you mean 'fedprox'?)")
    one_line(capsys, 2, [*sweep, "-a", "fedavg", "--seeds", "0,x", "--out", "sw"], "integers")
    line = one_line(capsys, 2, [*sweep, "-a", "fedavg", "--out", "notes.txt"], "notes.txt")
    assert "cannot use" in line
    assert (in_tmp / "notes.txt").read_text() == "mine"


def test_a_preset_or_config_that_is_not_a_file_says_what_it_is(in_tmp, capsys):
    """#34: ``--preset /dev/zero`` and ``--preset <folder>`` said "does not exist"."""
    (in_tmp / "presets").mkdir()
    run = ["run", "--dry-run"]
    one_line(capsys, 2, [*run, "--preset", "/dev/zero"], "/dev/zero is not a regular file")
    one_line(capsys, 2, [*run, "--preset", "presets/"], "preset file presets is a folder")
    one_line(capsys, 2, [*run, "--config", "presets"], "config file presets is a folder")
    one_line(capsys, 2, [*run, "--preset", "gone.toml"], "preset file gone.toml does not exist")


def test_sweep_out_on_a_foreign_folder_is_not_called_a_run_directory(in_tmp, capsys):
    """#34: a user's folder holding a config.json of theirs was called "a run directory"."""
    (in_tmp / "project").mkdir()
    (in_tmp / "project" / "config.json").write_text('{"mine": true}\n')
    argv = ["sweep", "-a", "fedavg", "-t", "optdigits", "--out", "project", "--rounds", "1"]
    line = one_line(capsys, 2, argv, "cannot use --out project: it holds config.json")
    assert "run directory" not in line and "nothing was changed" in line
    assert sorted(p.name for p in (in_tmp / "project").iterdir()) == ["config.json"]


def test_a_run_failing_before_its_first_checkpoint_does_not_suggest_resume(
    in_tmp, capsys, monkeypatch
):
    """#34: it suggested ``--resume``, which only starts the same failing run again."""
    with monkeypatch.context() as patch:
        interrupt_in_round(patch, 1, RoundFailed("round 1: 0 of 3 clients replied"))
        line = one_line(capsys, 2, ["run", *TINY, "--out", "r"], "before its first checkpoint")
    assert "--resume" not in line and "run the same command again" in line
