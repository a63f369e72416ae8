"""One writer per run directory: a second run into it fails clearly, a second sweep skips it."""

from __future__ import annotations

import contextlib
import fcntl
import json

import pytest

from fedshift.cli import main
from fedshift.core.errors import ConfigError
from fedshift.core.runfiles import LOCK_NAME, MARKER_NAME
from fedshift.engine.run.rundir import RunDirectoryBusy, claim_run_dir, clear_run_dir
from fedshift.sweeps import sweep

SMALL = ["client_data_fraction=0.05", "device=cpu"]


@contextlib.contextmanager
def held_elsewhere(run_dir):
    """The lock as another process would hold it: its own open file, flocked."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / LOCK_NAME, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        yield


def files_of(run_dir):
    """Every file under a run directory (tensorboard/ included) with its bytes."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def test_claim_is_reentrant_in_one_process_and_exclusive_across_holders(tmp_path):
    run_dir = tmp_path / "r"
    with claim_run_dir(run_dir), claim_run_dir(run_dir):
        assert (run_dir / LOCK_NAME).exists()
    with held_elsewhere(run_dir), pytest.raises(RunDirectoryBusy, match="in use by another"):
        with claim_run_dir(run_dir):
            pass
    with claim_run_dir(run_dir):  # released by the other holder: free again
        pass


def test_resume_of_a_run_in_use_is_refused_and_touches_nothing(in_tmp, capsys):
    argv = ["run", "--rounds", "2", "--quiet", "--out", "r", "--set", SMALL[0]]
    assert main([*argv, "--set", SMALL[1]]) == 0
    before = files_of(in_tmp / "r")
    capsys.readouterr()
    with held_elsewhere(in_tmp / "r"):
        assert main(["run", "--resume", "--out", "r", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "in use by another fedshift process" in err[0], err
    assert files_of(in_tmp / "r") == before


def test_a_second_sweep_skips_the_run_another_process_writes(in_tmp, capsys):
    plan = dict(algorithms=["fedavg"], targets=["optdigits"], seeds=[0, 1], out="sw")
    options = dict(flags={"rounds": 1}, sets=SMALL, progress=False)
    busy = in_tmp / "sw" / "fedavg-optdigits-s1"
    with held_elsewhere(busy):
        summaries = sweep(**plan, **options)
    assert [s["seed"] for s in summaries] == [0]
    assert "fedavg-optdigits-s1: another process runs it; skipped" in capsys.readouterr().out
    assert not (busy / "summary.json").exists()
    # once the other writer is gone the same sweep runs it and reads the first back
    summaries = sweep(**plan, **options)
    assert [s["seed"] for s in summaries] == [0, 1]
    assert json.loads((busy / "summary.json").read_text())["seed"] == 1


def foreign_project(folder):
    """A user's project folder: sources, a .git, and a config.json of its own."""
    (folder / ".git").mkdir(parents=True)
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "src").mkdir()
    (folder / "src" / "model.py").write_text("print('mine')\n")
    (folder / "config.json").write_text('{"mine": true}\n')
    return files_of(folder)


@pytest.mark.parametrize("resume", [False, True])
def test_out_on_a_foreign_folder_with_a_config_json_is_refused_and_nothing_is_lost(
    in_tmp, capsys, resume
):
    before = foreign_project(in_tmp / "project")
    argv = ["run", "--rounds", "1", "--quiet", "--out", "project", "--set", SMALL[0]]
    assert main([*argv, *(["--resume"] if resume else [])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "not a fedshift run directory" in err[0] or "no checkpoint" in err[0], err
    assert files_of(in_tmp / "project") == before
    assert sorted(p.name for p in (in_tmp / "project").iterdir()) == [".git", "config.json", "src"]


def test_out_dot_in_a_project_folder_is_refused(in_tmp, capsys):
    before = foreign_project(in_tmp)
    assert main(["run", "--rounds", "1", "--quiet", "--out", ".", "--set", SMALL[0]]) == 2
    assert "not a fedshift run directory" in capsys.readouterr().err
    assert files_of(in_tmp) == before


def test_a_run_dir_with_a_foreign_file_beside_its_config_is_not_cleared(in_tmp, capsys):
    """Even fedshift's own marker does not make a user's file deletable."""
    (in_tmp / "r").mkdir()
    (in_tmp / "r" / MARKER_NAME).write_text("")
    (in_tmp / "r" / "config.json").write_text("{}\n")
    (in_tmp / "r" / "notes.txt").write_text("keep me\n")
    assert main(["run", "--rounds", "1", "--quiet", "--out", "r", "--set", SMALL[0]]) == 2
    assert "notes.txt" in capsys.readouterr().err
    assert (in_tmp / "r" / "notes.txt").read_text() == "keep me\n"
    with claim_run_dir(in_tmp / "r"), pytest.raises(ConfigError, match="notes.txt"):
        clear_run_dir(in_tmp / "r")
    assert (in_tmp / "r" / "notes.txt").exists()


def test_a_run_stopped_before_its_first_checkpoint_is_still_started_again(in_tmp, caplog):
    """The case the clearing exists for: fedshift's own marker, config and metrics only."""
    run_dir = in_tmp / "r"
    with claim_run_dir(run_dir):
        (run_dir / "config.json").write_text("{}\n")
        (run_dir / "metrics.jsonl").write_text("")
        (run_dir / "tensorboard").mkdir()
    argv = ["run", "--rounds", "1", "--quiet", "--out", "r", "--set", SMALL[0], "--set", SMALL[1]]
    assert main(argv) == 0
    assert "starting it again from round 1" in caplog.text
    assert (run_dir / "summary.json").exists() and (run_dir / MARKER_NAME).exists()


def test_a_sweep_never_clears_a_foreign_folder_in_its_plan(in_tmp, capsys):
    before = foreign_project(in_tmp / "sw" / "fedavg-optdigits-s0")
    plan = dict(algorithms=["fedavg"], targets=["optdigits"], seeds=[0], out="sw")
    summaries = sweep(**plan, flags={"rounds": 1}, sets=SMALL, progress=False)
    assert summaries == []
    assert "not a fedshift run directory" in capsys.readouterr().out
    assert files_of(in_tmp / "sw" / "fedavg-optdigits-s0") == before


def test_run_experiment_as_the_flower_serverapp_calls_it_refuses_a_foreign_out_dir(in_tmp):
    """The ServerApp's ``out-dir`` goes through the same run_experiment as the CLI."""
    from fedshift.config import resolve
    from fedshift.engine.run.runner import run_experiment

    before = foreign_project(in_tmp / "project")
    cfg = resolve(None, {"rounds": 1}, SMALL)
    for resume in (False, True):
        with pytest.raises(ConfigError, match="not a fedshift run directory"):
            run_experiment(cfg, "project", resume=resume, progress=False)
    assert files_of(in_tmp / "project") == before


def test_resume_of_a_folder_holding_a_checkpoint_touches_no_user_file(in_tmp, capsys):
    """#34: a fedshift checkpoint in a folder used to skip the foreign-entry check; a user's
    ``report.v2.tmp`` beside it was deleted and their ``summary.json`` overwritten."""
    argv = ["run", "--rounds", "1", "--quiet", "--set", SMALL[0], "--set", SMALL[1]]
    assert main([*argv, "--out", "r"]) == 0
    project = in_tmp / "project"
    project.mkdir()
    for name in ("checkpoint.pt", "config.json"):
        (project / name).write_bytes((in_tmp / "r" / name).read_bytes())
    (project / "summary.json").write_text('{"mine": true}\n')
    (project / "report.v2.tmp").write_text("draft\n")
    (in_tmp / "r" / "report.v2.tmp").write_text("draft\n")
    capsys.readouterr()
    for folder in (project, in_tmp / "r"):
        before = files_of(folder)
        resume = ["run", "--out", str(folder), "--resume", "--rounds", "2", "--quiet"]
        assert main(resume) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "not a fedshift run directory" in err[0], err
        assert "report.v2.tmp" in err[0] and "nothing was changed" in err[0]
        assert files_of(folder) == before
    # its own: a figure fedshift wrote into the run and a temp file of a killed writer
    (in_tmp / "r" / "report.v2.tmp").unlink()
    assert main(["plot", "curves", "r", "--out", "r/curves.png"]) == 0
    (in_tmp / "r" / "checkpoint.pt.k2j4_x9a.tmp").write_bytes(b"half")
    assert main(["run", "--out", "r", "--resume", "--rounds", "2", "--quiet"]) == 0
    assert not (in_tmp / "r" / "checkpoint.pt.k2j4_x9a.tmp").exists()
    assert (in_tmp / "r" / "curves.png").is_file()


def test_restart_refuses_a_tensorboard_folder_holding_a_users_file(in_tmp, capsys):
    """#34: restarting a run stopped before its first checkpoint cleared ``tensorboard/``
    with a user's notebook in it."""
    run_dir = in_tmp / "r"
    with claim_run_dir(run_dir):
        (run_dir / "config.json").write_text("{}\n")
        (run_dir / "tensorboard").mkdir()
        (run_dir / "tensorboard" / "events.out.tfevents.1764300000.host.1.0").write_bytes(b"")
        (run_dir / "tensorboard" / "analysis.ipynb").write_text("{}\n")
    before = files_of(run_dir)
    argv = ["run", "--rounds", "1", "--quiet", "--out", "r", "--set", SMALL[0], "--set", SMALL[1]]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "tensorboard/analysis.ipynb" in err and "not a fedshift run directory" in err, err
    assert files_of(run_dir) == before
    with claim_run_dir(run_dir), pytest.raises(ConfigError, match="tensorboard/analysis.ipynb"):
        clear_run_dir(run_dir)
    assert files_of(run_dir) == before
