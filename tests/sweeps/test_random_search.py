"""``fedshift sweep --random N``: a seeded random search drawn from the ``search``
distributions declared with each hyperparameter (and lr, weight_decay), DomainBed-style."""

from __future__ import annotations

import math
import random

import pytest

from fedshift.algorithms import REGISTRY
from fedshift.cli import main
from fedshift.core.errors import ConfigError
from fedshift.core.hparams import describe_hparams, hp, integers, log_uniform, one_of, uniform
from fedshift.sweeps import plan
from fedshift.sweeps.random_search import random_points, searched_keys


def planned_points(tmp_path, **options):
    runs = plan(["fedprox", "fedavg"], ["mnistm", "syn"], [0, 1], tmp_path, **options)
    return [(run.cfg.algorithm, run.cfg.target, run.cfg.seed, run.grid) for run in runs]


def test_random_search_crosses_points_with_targets_and_seeds_first_point_the_defaults(
    tmp_path,
):
    runs = plan(["fedprox", "fedavg"], ["mnistm", "syn"], [0, 1], tmp_path, random_trials=3)
    assert len(runs) == 2 * 2 * 2 * 3
    fedprox = [run for run in runs if run.cfg.algorithm == "fedprox"]
    assert set(fedprox[0].grid) == {"algo.mu", "lr", "weight_decay"}
    assert set(runs[-1].grid) == {"lr", "weight_decay"}  # fedavg declares no search of its own
    assert fedprox[0].grid == {"algo.mu": 0.01, "lr": 0.01, "weight_decay": 0.0005}
    assert fedprox[0].name == "fedprox-mnistm-s0@algo.mu=0.01,lr=0.01,weight_decay=0.0005"
    # the same point for every target and seed of an algorithm: seeds average one setting
    points = {run.name.split("@")[1] for run in fedprox}
    assert len(points) == 3
    for run in fedprox:
        assert run.cfg.algo["mu"] == run.grid["algo.mu"] and run.cfg.lr == run.grid["lr"]


def test_random_search_is_reproducible_and_its_seed_changes_the_draws(tmp_path):
    first = planned_points(tmp_path, random_trials=4)
    assert planned_points(tmp_path, random_trials=4) == first
    other = planned_points(tmp_path, random_trials=4, random_seed=1)
    assert other != first
    # trial 0 (the defaults) does not depend on the seed
    assert [p for p in other if p[3]["lr"] == 0.01] == [p for p in first if p[3]["lr"] == 0.01]


def test_draws_stay_in_their_declared_distribution():
    spaces = searched_keys("feddg-elcfs", set())
    assert set(spaces) == {"algo.meta_step", "algo.boundary_weight", "lr", "weight_decay"}
    for point in random_points("feddg-elcfs", 200, 7, set())[1:]:
        for key, value in point.items():
            assert spaces[key].low <= value <= spaces[key].high, (key, value)
            assert float(f"{value:.3g}") == value  # 3 significant digits: exact folder names
    # log-uniform: about half of the draws below the geometric mean of the bounds
    draws = [log_uniform(1e-4, 1.0).draw(random.Random(i)) for i in range(2000)]
    below = sum(d < 1e-2 for d in draws) / len(draws)
    assert 0.45 < below < 0.55


def test_keys_fixed_by_set_are_not_drawn(tmp_path):
    runs = plan(["fedprox"], ["mnistm"], [0], tmp_path, sets=["lr=0.05"], random_trials=3)
    assert {run.cfg.lr for run in runs} == {0.05}
    assert all(set(run.grid) == {"algo.mu", "weight_decay"} for run in runs)


def test_grid_and_random_together_and_a_negative_count_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="--grid or --random"):
        plan(["fedprox"], ["mnistm"], [0], tmp_path, grid=["lr=0.1,0.2"], random_trials=2)
    with pytest.raises(ConfigError, match="--random must be at least 1"):
        plan(["fedprox"], ["mnistm"], [0], tmp_path, random_trials=-1)


def test_every_declared_search_lies_inside_its_hyperparameters_range():
    searched = 0
    for name, cls in REGISTRY.items():
        for info in describe_hparams(cls.Hparams):
            searched += bool(info.search_text)
        for key, space in searched_keys(name, set()).items():
            if key.startswith("algo."):
                cls.Hparams(**{key[5:]: space.low if space.kind != "choice" else space.choices[0]})
    assert searched >= 10
    run_keys = {k: space.text() for k, space in searched_keys("fedavg", set()).items()}
    assert run_keys == {
        "lr": "log-uniform [0.001, 0.1]",
        "weight_decay": "log-uniform [1e-06, 0.01]",
    }


def test_a_search_leaving_the_range_or_a_bad_distribution_is_refused_at_declaration():
    with pytest.raises(TypeError, match="leaves the range"):
        hp(0.5, low=0, high=1, search=uniform(0.1, 2.0))
    with pytest.raises(TypeError, match="0 < low < high"):
        log_uniform(0.0, 1.0)
    with pytest.raises(TypeError, match="two choices"):
        one_of("a")
    assert integers(1, 4).text() == "integer [1, 4]"
    assert math.isclose(log_uniform(1e-3, 1.0).draw(random.Random(0)), 0.341, rel_tol=1e-12)


def test_show_prints_each_searched_distribution_and_the_cli_runs_a_random_sweep(tmp_path, capsys):
    assert main(["show", "moon"]) == 0
    out = capsys.readouterr().out
    assert "log-uniform [0.1, 10]" in out and "uniform [0.1, 1]" in out
    code = main(
        ["sweep", "-a", "fedavg", "-t", "mnistm", "--random", "2", "--rounds", "1", "--quiet",
         "--out", str(tmp_path / "rs"), "--set", "client_data_fraction=0.05",
         "--set", "threads=1", "--set", "tracking=none", "--set", "device=cpu"]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "lr=0.01,weight_decay=0.0005" in out and "selected by source validation" in out
    assert len(list((tmp_path / "rs").iterdir())) == 2
