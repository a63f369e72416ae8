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
