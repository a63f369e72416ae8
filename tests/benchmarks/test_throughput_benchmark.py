"""benchmarks/speed/throughput.py --quick runs and prints its two tables (CI smoke)."""

from __future__ import annotations

import importlib
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks" / "speed"


def _cells(lines: list[str], clients: str) -> list[list[str]]:
    """The cells of the table rows of ``clients`` clients."""
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines if line[:1] == "|"]
    return [row for row in rows if row[0] == clients]


def test_quick_throughput_tables(in_tmp, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    throughput = importlib.import_module("throughput")
    argv = ["--quick", "--repeats", "2", "--samples-per-client", "8", "--batch-size", "4"]
    lines = throughput.main(argv)
    assert "8 samples per client" in lines[0]
    rows = _cells(lines, "4")
    methods = [row[1] for row in rows if len(row) == 6]
    assert methods == list(throughput.METHODS)
    for row in rows[: len(methods)]:
        assert float(row[3].replace(",", "")) > 0
    ratios = {row[1]: row[2:] for row in rows if len(row) == 5}
    assert list(ratios) == [f"{a} / {b}" for a, b in throughput.PAIRS]
    for median, spread, pairs in ratios.values():
        low, high = (float(x) for x in spread.split("–"))
        assert low <= float(median) <= high and pairs == "2"
    assert "| 4 | sequential / bare |" in capsys.readouterr().out


def test_fixed_samples_per_client(in_tmp, monkeypatch):
    """Every client gets --samples-per-client samples, more than its natural share too."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    fedavg_bench = importlib.import_module("fedavg_bench")
    for clients, samples in ((2, 5), (400, 12)):
        setting = fedavg_bench.Setting(clients, samples, 1, 4, "cpu", 1)
        data = fedavg_bench.BareData(fedavg_bench.experiment(setting))
        assert [len(x) for x, _ in data.clients] == [samples] * clients
