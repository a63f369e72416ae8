"""benchmarks/throughput.py --quick runs and prints the side-by-side table (CI smoke)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "throughput.py"


def test_quick_throughput_table(in_tmp, capsys, monkeypatch):
    spec = importlib.util.spec_from_file_location("throughput", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "throughput", module)
    spec.loader.exec_module(module)
    lines = module.main(["--quick", "--repeats", "1", "--data-fraction", "0.05"])
    rows = [line for line in lines if line.startswith("| 4 |")]
    assert [row.split("|")[2].strip() for row in rows] == list(module.METHODS)
    for row in rows:
        rate = float(row.split("|")[4].replace(",", ""))
        assert rate > 0
    assert "vectorized/sequential" in lines[-1] and "sequential/bare" in lines[-1]
    assert "| 4 | sequential |" in capsys.readouterr().out
