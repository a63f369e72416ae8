"""One writer per run directory: a second run into it fails clearly, a second sweep skips it."""

from __future__ import annotations

import contextlib
import fcntl
import json

import pytest

from fedshift.cli import main
from fedshift.engine.rundir import LOCK_NAME, RunDirectoryBusy, claim_run_dir
from fedshift.engine.sweep import sweep

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
