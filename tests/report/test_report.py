"""Result tables from hand-made summaries."""

import json

from fedshift.cli import main
from fedshift.report.aggregate import find_summaries, markdown, table


def write(root, algo, target, seed, acc, **extra):
    run = root / f"{algo}-{target}-s{seed}"
    run.mkdir(parents=True)
    summary = {"algorithm": algo, "target": target, "seed": seed, "target_accuracy": acc}
    (run / "summary.json").write_text(json.dumps({**summary, **extra}))


def test_table_mean_std_and_average_column(tmp_path):
    write(tmp_path, "fedavg", "a", 0, 0.50)
    write(tmp_path, "fedavg", "a", 1, 0.70)
    write(tmp_path, "fedavg", "b", 0, 0.90)
    write(tmp_path, "fedavg", "b", 1, 0.90)
    write(tmp_path, "local", "a", 0, 0.25)
    header, body = table(find_summaries([tmp_path]), rows=["fedavg", "local"])
    assert header == ["method", "a", "b", "avg"]
    # a: mean 60, sample std 14.1; b: 90 ± 0; avg per seed: 70, 80 -> 75 ± 7.1
    assert body[0] == ["fedavg", "60.0 ± 14.1", "90.0 ± 0.0", "75.0 ± 7.1"]
    # local lacks target b: no average
    assert body[1] == ["local", "25.0", "-", "-"]
    assert markdown(header, body).splitlines()[1] == "|---|---|---|---|"


def test_report_cli_errors_on_empty_folder(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "no summary.json" in capsys.readouterr().err


def test_non_accuracy_metrics_are_not_shown_as_percent(tmp_path):
    write(tmp_path, "fedproto", "clients", 0, 0.9, bytes_per_round=54144.0)
    write(tmp_path, "fedproto", "clients", 1, 0.9, bytes_per_round=54000.0)
    _, body = table(find_summaries([tmp_path]), metric="bytes_per_round")
    assert body[0] == ["fedproto", "54,072 ± 102", "54,072 ± 102"]


def engine_run(root, name, seed, accuracy, grid=None, **settings):
    """A run directory as the engine writes it: config.json (every setting, resolved),
    metrics.jsonl and summary.json."""
    from fedshift.core.runconfig import RunConfig

    cfg = RunConfig(seed=seed, **settings).to_dict()
    run = root / name
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({**cfg, "run_info": {"threads": 1}}))
    line = {"round": cfg["rounds"], "target_accuracy": accuracy}
    (run / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    summary = {
        "algorithm": cfg["algorithm"],
        "dataset": cfg["dataset"],
        "protocol": cfg["protocol"],
        "target": cfg["target"],
        "seed": seed,
        "rounds": cfg["rounds"],
        "target_accuracy": accuracy,
        "source_val_accuracy": accuracy,
        **({"grid": grid} if grid else {}),
    }
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_report_never_mixes_experiments(tmp_path, capsys):
    """The issue's folder: the README's 30-round main job (80.0), a 1-round grid run and a
    3-round run of the same method and seed, and a PACS run: each is its own table, named
    by what differs, and the main job's 80.0 stands in its own cell."""
    runs = tmp_path / "runs"
    engine_run(runs, "main", 0, 0.80, rounds=30)
    engine_run(runs, "grid/fedavg-mnistm-lr0.05-s0", 0, 0.184, grid={"lr": 0.05}, rounds=1, lr=0.05)
    engine_run(runs, "short", 0, 0.312, rounds=3)
    engine_run(runs, "short-s1", 1, 0.334, rounds=3, device="cpu", threads=2)
    pacs = {"dataset": "pacs", "target": "sketch", "rounds": 10, "image_size": 32}
    engine_run(runs, "pacs", 0, 0.397, **pacs)
    assert main(["report", str(runs)]) == 0
    out = capsys.readouterr().out
    sections = out.split("## experiment ")[1:]
    assert [s.splitlines()[0] for s in sections] == [
        "1 of 4: dataset=digits-dg, image_size=0, lr=(grid), rounds=1 (1 run)",
        "2 of 4: dataset=digits-dg, image_size=0, lr=0.01, rounds=30 (1 run)",
        "3 of 4: dataset=pacs, image_size=32, lr=0.01, rounds=10 (1 run)",
        "4 of 4: dataset=digits-dg, image_size=0, lr=0.01, rounds=3 (2 runs)",
    ]
    assert "| fedavg | 18.4 | 18.4 |" in sections[0]  # the grid run, selected on its own
    assert "| fedavg | 80.0 | 80.0 |" in sections[1]
    assert "| method | sketch | avg |" in sections[2] and "| fedavg | 39.7 | 39.7 |" in sections[2]
    assert "| fedavg | 32.3 ± 1.6 | 32.3 ± 1.6 |" in sections[3]  # two seeds of one experiment


def test_a_seed_counts_once_and_hyperparameters_split_rows(tmp_path, capsys):
    """A copy of a run is the same experiment and seed: counted once, named on stderr. Two
    FedProx runs that differ in mu are two rows; mu given at its default is no difference."""
    runs = tmp_path / "runs"
    engine_run(runs, "a/fedavg-s0", 0, 0.50)
    engine_run(runs, "b/fedavg-s0", 0, 0.70)  # the same experiment and seed again
    engine_run(runs, "fedavg-s1", 1, 0.60)
    engine_run(runs, "prox-default", 0, 0.40, algorithm="fedprox")
    engine_run(runs, "prox-0.01", 1, 0.44, algorithm="fedprox", algo={"mu": 0.01})
    engine_run(runs, "prox-0.1", 0, 0.30, algorithm="fedprox", algo={"mu": 0.1})
    assert main(["report", str(runs)]) == 0
    captured = capsys.readouterr()
    assert "## experiment" not in captured.out  # one kind: one table, no heading
    assert "| fedavg | 55.0 ± 7.1 | 55.0 ± 7.1 |" in captured.out  # seeds 0 (a) and 1
    assert "| fedprox (algo.mu=0.01) | 42.0 ± 2.8 | 42.0 ± 2.8 |" in captured.out
    assert "| fedprox (algo.mu=0.1) | 30.0 | 30.0 |" in captured.out
    notes = [line for line in captured.err.splitlines() if "counted once" in line]
    assert notes == [
        f"fedshift: {runs / 'b/fedavg-s0'} repeats the experiment and seed of "
        f"{runs / 'a/fedavg-s0'}: counted once"
    ]


def test_the_mean_of_the_last_rounds_says_what_it_covers():
    """A run of fewer than 5 rounds does not claim a mean of the last 5."""
    from fedshift.report.table import format_summary

    def text(rounds):
        summary = {
            "algorithm": "fedavg", "dataset": "digits-dg", "protocol": "lodo",
            "target": "mnistm", "seed": 0, "rounds": rounds, "selected_round": 1,
            "per_domain_accuracy": {"mnistm": 0.5}, "target_accuracy": 0.5,
            "target_accuracy_last": 0.5, "target_accuracy_last5": 0.5,
            "target_accuracy_oracle": 0.5, "oracle_round": 1, "bytes_up": 1.0,
            "bytes_down": 1.0, "wall_seconds": 1.0, "samples_per_second": 1.0,
        }  # fmt: skip
        return [line for line in format_summary(summary).splitlines() if "mean of" in line]

    assert text(1) == []
    assert text(3) == ["target accuracy (mean of all evaluated rounds, fewer than 5): 50.00"]
    assert text(30) == ["target accuracy (mean of the last 5 evaluated rounds): 50.00"]


def test_datasets_list_prints_commands_that_run():
    """The printed command names a target of the dataset (the default, mnistm, is
    digits-dg's) and a segmentation set's problem and model."""
    from fedshift.cli.datasets import dataset_lines

    runs = {line.name: line.runs for line in dataset_lines()}
    assert runs["pacs"] == "fedshift run -d pacs -t art_painting --set data_root=PATH"
    assert runs["office-home"].startswith("fedshift run -d office-home -t Art ")
    assert "--set problem=segmentation --model unet" in runs["fundus"]
