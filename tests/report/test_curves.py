"""Per-round curves: runs grouped by config, mean ± std over seeds, integer round ticks."""

from __future__ import annotations

import json
import statistics

import pytest

from fedshift.cli import main
from fedshift.core.errors import ConfigError
from fedshift.report import curves

ROUNDS = 5


def fake_run(root, name, seed, accuracies, **config):
    """A run directory as fedshift writes it: config.json, metrics.jsonl, summary.json."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    settings = {"algorithm": "fedavg", "target": "mnistm", "seed": seed, "lr": 0.01, **config}
    settings.update(device="cpu", threads=seed + 1, algo={"mu": 0.0})  # never split groups
    (run_dir / "config.json").write_text(json.dumps(settings))
    lines = [
        {
            "round": r,
            "train_loss": 2.0 - a,
            "target_accuracy": a,
            "per_domain_accuracy": {"mnistm": a},
        }
        for r, a in enumerate(accuracies, start=1)
    ]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = {
        "algorithm": settings["algorithm"],
        "target": settings["target"],
        "seed": seed,
        "target_accuracy": max(accuracies),
        "target_accuracy_last": accuracies[-1],
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


SEED0 = [0.1, 0.2, 0.3, 0.35, 0.4]
SEED1 = [0.2, 0.2, 0.5, 0.45, 0.6]


def test_two_seeds_of_one_config_are_one_band_around_their_mean(tmp_path):
    runs = [fake_run(tmp_path, "s0", 0, SEED0), fake_run(tmp_path, "s1", 1, SEED1)]
    metric, groups = curves.curve_groups(runs, "target_accuracy")
    assert metric == "target_accuracy"
    (group,) = groups
    assert group.label == "fedavg → mnistm" and group.runs == runs
    assert group.rounds == list(range(1, ROUNDS + 1))
    assert group.mean == pytest.approx([(a + b) / 2 for a, b in zip(SEED0, SEED1, strict=True)])
    assert group.std == pytest.approx(
        [statistics.stdev([a, b]) for a, b in zip(SEED0, SEED1, strict=True)]
    )
    fig = curves.draw_curves(groups, metric)
    (ax,) = fig.axes
    (line,) = ax.lines
    assert list(line.get_xdata()) == group.rounds
    assert list(line.get_ydata()) == pytest.approx([100 * m for m in group.mean])
    (band,) = ax.collections  # the ±1 std band
    edge = band.get_paths()[0].vertices[:, 1]
    spread = list(zip(group.mean, group.std, strict=True))
    assert edge.min() == pytest.approx(100 * min(m - s for m, s in spread))
    assert edge.max() == pytest.approx(100 * max(m + s for m, s in spread))
    assert ax.get_ylabel() == "target_accuracy (%)"
    fig.canvas.draw()
    ticks = [t for t in ax.get_xticks() if 1 <= t <= ROUNDS]
    assert ticks and all(float(t).is_integer() for t in ticks)


def test_configs_that_differ_beyond_the_seed_are_separate_lines_named_by_the_difference(
    tmp_path,
):
    runs = [
        fake_run(tmp_path, "a0", 0, SEED0),
        fake_run(tmp_path, "a1", 1, SEED1),
        fake_run(tmp_path, "b0", 0, SEED1, lr=0.1),
        fake_run(tmp_path, "c0", 0, SEED0, algorithm="fedprox", target="syn"),
    ]
    _, groups = curves.curve_groups(runs, "train_loss")
    assert [g.label for g in groups] == [
        "fedavg → mnistm (lr=0.01)",
        "fedavg → mnistm (lr=0.1)",
        "fedprox → syn (lr=0.01)",
    ]
    assert [len(g.runs) for g in groups] == [2, 1, 1]
    fig = curves.draw_curves(groups, "train_loss")
    colours = [line.get_color() for line in fig.axes[0].lines]
    assert len(set(colours)) == 3
    assert fig.axes[0].get_ylabel() == "train_loss"


def test_nested_and_summary_metrics_draw_their_per_round_values(tmp_path):
    runs = [fake_run(tmp_path, "s0", 0, SEED0)]
    assert curves.curve_groups(runs, "per_domain_accuracy/mnistm")[1][0].mean == SEED0
    metric, groups = curves.curve_groups(runs, "target_accuracy_last")
    assert metric == "target_accuracy" and groups[0].mean == SEED0
    with pytest.raises(ConfigError, match=r"unknown per-round metric 'train_los' \(did you mean"):
        curves.curve_groups(runs, "train_los")


def test_plot_curves_command_writes_a_png_and_refuses_an_unknown_metric(tmp_path, capsys):
    fake_run(tmp_path / "runs", "s0", 0, SEED0)
    fake_run(tmp_path / "runs", "s1", 1, SEED1)
    out = tmp_path / "curves.png"
    assert main(["plot", "curves", str(tmp_path / "runs"), "--out", str(out)]) == 0
    assert out.stat().st_size > 1000
    capsys.readouterr()
    argv = ["plot", "curves", str(tmp_path / "runs"), "--out", str(out), "--metric", "nope"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedshift: error: unknown per-round metric 'nope'")
    assert main(["plot", "curves", str(tmp_path / "missing"), "--out", str(out)]) == 2


def test_report_plot_draws_the_chosen_metric(tmp_path, capsys):
    fake_run(tmp_path / "runs", "s0", 0, SEED0)
    fake_run(tmp_path / "runs", "s1", 1, SEED1)
    out = tmp_path / "report.png"
    argv = ["report", str(tmp_path / "runs"), "--metric", "target_accuracy_last"]
    assert main([*argv, "--plot", str(out)]) == 0
    assert out.stat().st_size > 1000
    assert main(["report", str(tmp_path / "runs"), "--metric", "nope", "--plot", str(out)]) == 2


def test_a_run_without_config_json_is_grouped_by_its_summary(tmp_path):
    runs = [fake_run(tmp_path, "s0", 0, SEED0), fake_run(tmp_path, "s1", 1, SEED1)]
    (runs[1] / "config.json").unlink()
    _, groups = curves.curve_groups(runs, "target_accuracy")
    assert [len(g.runs) for g in groups] == [2]
    (runs[1] / "summary.json").unlink()
    with pytest.raises(ConfigError, match="s1 is not a run directory \\(no config.json\\)"):
        curves.curve_groups(runs, "target_accuracy")
