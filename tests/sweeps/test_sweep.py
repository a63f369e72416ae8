"""Sweeps: hyperparameter grids crossed with algorithms × targets × seeds, their run names,
errors before any run, resume, parallel runs (same numbers as sequential ones), Ray tasks,
and hyperparameter selection in the report (source validation, and the labelled oracle)."""

from __future__ import annotations

import json

import pytest
from helpers import read_history

import fedshift
import fedshift.sweeps.planning as sweep_planning
from fedshift.cli import main
from fedshift.core.errors import ConfigError
from fedshift.engine.run.runner import run_experiment
from fedshift.report.aggregate import find_summaries
from fedshift.report.selection import points_table, selection_markdown, selection_table
from fedshift.sweeps import parse_grid, plan, sweep

#: a run of a few seconds: a twentieth of each client's data, one thread, no loggers
TINY = ["client_data_fraction=0.05", "device=cpu", "threads=1", "tracking=none", "image_size=16"]


def without_timing(rows):
    """Per-round rows without the keys that measure time."""
    return [{k: v for k, v in r.items() if "second" not in k and "time" not in k} for r in rows]


# -- planning: crossing, names, checks (nothing runs) ------------------------------------


def test_grid_crosses_algorithms_targets_seeds_with_stable_readable_names(tmp_path):
    grid = parse_grid(["lr=0.05,0.01", "algo.mu=1e-1,0.01"])
    runs = plan(["fedavg", "fedprox"], ["optdigits", "syn"], [0, 1], tmp_path, grid=grid)
    names = [run.name for run in runs]
    # fedavg has no mu: its lr points only (2 targets x 2 seeds x 2 lr), fedprox 2 x 2 x 4
    assert len(runs) == 8 + 16 and len(set(names)) == len(names)
    assert names[:2] == ["fedavg-optdigits-s0@lr=0.05", "fedavg-optdigits-s0@lr=0.01"]
    # keys sorted, values as resolved (1e-1 -> 0.1): the same name whatever the typing
    assert "fedprox-syn-s1@algo.mu=0.1,lr=0.01" in names
    by_name = {run.name: run for run in runs}
    run = by_name["fedprox-syn-s1@algo.mu=0.1,lr=0.01"]
    assert (run.cfg.algorithm, run.cfg.target, run.cfg.seed) == ("fedprox", "syn", 1)
    assert run.cfg.algo["mu"] == 0.1 and run.cfg.lr == 0.01
    assert run.grid == {"lr": 0.01, "algo.mu": 0.1}
    assert run.run_dir == tmp_path.absolute() / run.name
    # no grid: the names sweeps always had, so old sweeps resume
    plain = plan(["fedavg"], ["optdigits"], [0, 3], tmp_path)
    assert [r.name for r in plain] == ["fedavg-optdigits-s0", "fedavg-optdigits-s3"]
    assert all(r.grid == {} for r in plain)


def test_devices_round_robin_and_threads_split_among_jobs(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep_planning, "resolve_device", lambda name: name)
    monkeypatch.setattr(sweep_planning.os, "cpu_count", lambda: 8)
    grid = parse_grid(["lr=0.01,0.02,0.03"])
    runs = plan(["fedavg"], ["optdigits"], [0], tmp_path, grid=grid, devices=["cuda:0", "cuda:1"])
    assert [r.cfg.device for r in runs] == ["cuda:0", "cuda:1", "cuda:0"]
    assert all(r.cfg.threads == 0 for r in runs)  # one job: torch's default
    assert {r.cfg.threads for r in plan(["fedavg"], ["syn"], [0, 1], tmp_path, jobs=3)} == {2}
    mine = plan(["fedavg"], ["syn"], [0], tmp_path, jobs=3, sets=["threads=1"])
    assert mine[0].cfg.threads == 1  # the user's setting is kept


@pytest.mark.parametrize(
    "grid,expected",
    [
        (["lrr=0.1,0.2"], "unknown config key 'lrr' (did you mean 'lr'?)"),
        (["algo.mux=0.1"], "no algorithm of the sweep (fedavg, fedprox) has hyperparameter 'mux'"),
        (["algo.mux=0.1"], "(did you mean 'mu'?)"),
        (["lr=0.1,fast"], "lr expects float, got 'fast'"),
        (["algo.mu=-1"], "mu"),
        (["seed=1,2"], "sweep seeds with --seeds"),
        (["lr"], "--grid expects KEY=v1,v2"),
        (["lr=0.1", "lr=0.2"], "--grid lr is given twice"),
        (["rounds=1,2"], "rounds is given both in --grid and as a fixed setting"),
    ],
)
def test_bad_grid_is_exit_2_before_any_run(in_tmp, capsys, grid, expected):
    argv = ["sweep", "-a", "fedavg,fedprox", "-t", "optdigits", "--rounds", "1", "--out", "sw"]
    for item in grid:
        argv += ["--grid", item]
    assert main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedshift: error: ") and expected in err[0], err
    assert not (in_tmp / "sw").exists()


def test_bad_jobs_devices_and_backend_are_exit_2(in_tmp, capsys):
    base = ["sweep", "-a", "fedavg", "-t", "optdigits", "--out", "sw", "--quiet"]
    cases = [
        (["--jobs", "0"], "--jobs must be at least 1"),
        (["--devices", "gpu"], "unknown device 'gpu'"),
        (["--devices", "cuda:7"], "cuda:7"),
    ]
    for extra, expected in cases:
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], err
    with pytest.raises(ConfigError, match="unknown backend 'rey'"):
        sweep(["fedavg"], ["optdigits"], [0], in_tmp / "sw", backend="rey")
    assert not (in_tmp / "sw").exists()


# -- running ---------------------------------------------------------------------------


def test_grid_sweep_resumes_a_partially_done_grid(in_tmp, capsys):
    options = dict(flags={"rounds": 2}, sets=TINY, grid=["lr=0.01,0.05"])
    runs = plan(["fedavg"], ["optdigits"], [0], "sw", **options)
    # the second grid point was interrupted after round 1 (a checkpoint, no summary)
    run_experiment(runs[1].cfg, runs[1].run_dir, stop_after=1, progress=False)
    assert not (runs[1].run_dir / "summary.json").exists()
    summaries = sweep(["fedavg"], ["optdigits"], [0], "sw", progress=True, **options)
    out = capsys.readouterr().out
    assert "[1/2] fedavg-optdigits-s0@lr=0.01\n" in out
    assert "[2/2] fedavg-optdigits-s0@lr=0.05 (resuming)" in out
    assert [s["grid"] for s in summaries] == [{"lr": 0.01}, {"lr": 0.05}]
    assert [json.loads((r.run_dir / "summary.json").read_text())["grid"] for r in runs] == [
        {"lr": 0.01},
        {"lr": 0.05},
    ]
    assert [r["round"] for r in read_history(runs[1].run_dir)] == [1, 2]
    # the same sweep again: everything is read back, nothing runs
    before = {r.name: (r.run_dir / "summary.json").read_bytes() for r in runs}
    again = sweep(["fedavg"], ["optdigits"], [0], "sw", progress=True, **options)
    assert "[" not in capsys.readouterr().out
    assert again == summaries
    assert {r.name: (r.run_dir / "summary.json").read_bytes() for r in runs} == before


def test_a_failing_run_is_one_line_and_the_sweep_goes_on(in_tmp, capsys):
    argv = ["sweep", "-a", "fedavg", "-t", "optdigits", "--rounds", "1", "--out", "sw"]
    argv += ["--grid", "faults=raise@1:*,nan@9:0", "--set", "failure_policy=strict"]
    argv += [arg for item in TINY for arg in ("--set", item)]
    assert main(argv) == 1
    captured = capsys.readouterr()
    failed = [line for line in captured.out.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and failed[0].startswith("fedavg-optdigits-s0@faults=raise_1:_: ")
    assert "Traceback" not in captured.out + captured.err
    assert "1 of 2 runs failed: fedavg-optdigits-s0@faults=raise_1:_" in captured.err
    assert (in_tmp / "sw" / "fedavg-optdigits-s0@faults=nan_9:0" / "summary.json").exists()


def test_two_jobs_give_the_same_summaries_as_one(in_tmp, capsys):
    """Worker processes (spawned) compute exactly what the sweep computes in-process."""
    common = dict(flags={"rounds": 1}, sets=TINY, grid=["lr=0.02,0.05"], progress=False)
    one = sweep(["fedavg"], ["optdigits"], [0], "one", jobs=1, **common)
    two = sweep(["fedavg"], ["optdigits"], [0], "two", jobs=2, **common)
    assert len(one) == len(two) == 2 and not two.failed
    for a, b in zip(one, two, strict=True):
        assert a["grid"] == b["grid"]
        for key in ("target_accuracy", "target_accuracy_last", "source_val_accuracy"):
            assert a[key] == b[key], key
    for a, b in zip(one.run_dirs, two.run_dirs, strict=True):
        assert without_timing(read_history(a)) == without_timing(read_history(b))


def test_api_sweep_with_a_grid(in_tmp):
    results = fedshift.sweep(
        in_tmp / "api",
        algorithms=["fedprox"],
        targets=["optdigits"],
        grid={"algo.mu": [0.0, 0.5]},
        rounds=1,
        **dict(item.split("=") for item in TINY),
    )
    assert [r.run_dir.name for r in results] == [
        "fedprox-optdigits-s0@algo.mu=0.0",
        "fedprox-optdigits-s0@algo.mu=0.5",
    ]
    assert [r.config["algo"]["mu"] for r in results] == [0.0, 0.5]
    assert [r.summary["grid"] for r in results] == [{"algo.mu": 0.0}, {"algo.mu": 0.5}]


@pytest.mark.slow
def test_ray_backend_runs_each_run_as_a_task(in_tmp):
    """Ray's local instance takes ~10 s to start and its workers import torch (slow: ~60 s
    on 2 shared cores)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        common = dict(flags={"rounds": 1}, sets=TINY, grid=["lr=0.02,0.05"], progress=False)
        remote = sweep(["fedavg"], ["optdigits"], [0], "ray", backend="ray", jobs=2, **common)
    finally:
        ray.shutdown()
    local = sweep(["fedavg"], ["optdigits"], [0], "local", **common)
    assert [s["target_accuracy"] for s in remote] == [s["target_accuracy"] for s in local]
    assert [p.name for p in remote.run_dirs] == [p.name for p in local.run_dirs]


def test_ray_backend_missing_is_one_line(in_tmp, capsys, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    argv = ["sweep", "-a", "fedavg", "-t", "optdigits", "--out", "sw", "--backend", "ray"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "fedshift: error: --backend ray needs Ray, which is not installed: "
        "pip install 'fedshift[ray]'"
    ]


# -- selection over grid points (hand-made summaries) -----------------------------------


def write(root, algo, target, seed, grid, source_val, target_acc):
    point = ",".join(f"{k}={v}" for k, v in sorted(grid.items()))
    run = root / (f"{algo}-{target}-s{seed}" + (f"@{point}" if point else ""))
    run.mkdir(parents=True)
    summary = {
        "algorithm": algo,
        "target": target,
        "seed": seed,
        "target_accuracy": target_acc,
        "source_val_accuracy": source_val,
        **({"grid": grid} if grid else {}),
    }
    (run / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def grid_runs(tmp_path):
    """FedProx on target a over mu in {0.01, 0.1}, two seeds: mu=0.01 validates better on
    the sources (0.80, 0.90 vs 0.70, 0.70) but mu=0.1 is better on the target (0.50, 0.60
    vs 0.30, 0.40). On target b, mu=0.1 wins both. FedAvg without a grid."""
    for seed, (sv1, ta1, sv2, ta2) in enumerate([(0.8, 0.3, 0.7, 0.5), (0.9, 0.4, 0.7, 0.6)]):
        write(tmp_path, "fedprox", "a", seed, {"algo.mu": 0.01}, sv1, ta1)
        write(tmp_path, "fedprox", "a", seed, {"algo.mu": 0.1}, sv2, ta2)
        write(tmp_path, "fedprox", "b", seed, {"algo.mu": 0.01}, 0.5, 0.2)
        write(tmp_path, "fedprox", "b", seed, {"algo.mu": 0.1}, 0.6, 0.7 + seed / 10)
        write(tmp_path, "fedavg", "a", seed, {}, 0.6, 0.25)
    return tmp_path


def test_selection_by_source_validation_and_oracle(grid_runs):
    summaries = find_summaries([grid_runs])
    header, body = selection_table(summaries, rows=["fedavg", "fedprox"], by="source-val")
    assert header == ["method", "a", "b", "avg"]
    # a: mu=0.01 (source val 85 > 70): target 30, 40 -> 35 ± 7.1; b: mu=0.1: 70, 80
    # avg per seed: (30+70)/2=50, (40+80)/2=60 -> 55 ± 7.1
    assert body == [
        ["fedavg", "25.0 ± 0.0", "-", "-"],
        ["fedprox", "35.0 ± 7.1", "75.0 ± 7.1", "55.0 ± 7.1"],
    ]
    _, oracle = selection_table(summaries, rows=["fedavg", "fedprox"], by="oracle")
    # a: mu=0.1 (target 55 > 35): 50, 60; avg per seed 60, 70
    assert oracle[1] == ["fedprox", "55.0 ± 7.1", "75.0 ± 7.1", "65.0 ± 7.1"]
    header, rows = points_table(summaries, rows=["fedavg", "fedprox"])
    assert header[2:] == ["grid point", "seeds", "source val", "target_accuracy", "chosen by"]
    assert rows == [
        ["fedavg", "a", "(defaults)", "2", "60.0 ± 0.0", "25.0 ± 0.0",
         "source-val + oracle (target labels)"],
        ["fedprox", "a", "algo.mu=0.01", "2", "85.0 ± 7.1", "35.0 ± 7.1", "source-val"],
        ["fedprox", "a", "algo.mu=0.1", "2", "70.0 ± 0.0", "55.0 ± 7.1", "oracle (target labels)"],
        ["fedprox", "b", "algo.mu=0.01", "2", "50.0 ± 0.0", "20.0 ± 0.0", ""],
        ["fedprox", "b", "algo.mu=0.1", "2", "60.0 ± 0.0", "75.0 ± 7.1",
         "source-val + oracle (target labels)"],
    ]  # fmt: skip


def test_report_cli_shows_the_oracle_labelled_and_csv(grid_runs, capsys):
    assert main(["report", str(grid_runs), "--rows", "fedavg,fedprox"]) == 0
    out = capsys.readouterr().out
    sections = [line for line in out.splitlines() if line.startswith("###")]
    assert len(sections) == 3
    assert "selected by source validation" in sections[1]
    assert "ORACLE: uses target labels" in sections[2]
    assert out == selection_markdown(find_summaries([grid_runs]), rows=["fedavg", "fedprox"]) + "\n"
    assert main(["report", str(grid_runs), "--format", "csv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "method,target,grid point,seeds,source val,target_accuracy,chosen by"
    assert "fedprox,a,algo.mu=0.1,2,70.0 ± 0.0,55.0 ± 7.1,oracle (target labels)" in lines
