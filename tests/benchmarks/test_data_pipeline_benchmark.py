"""benchmarks/speed/data_pipeline.py --smoke runs and prints its four tables (CI smoke)."""

from __future__ import annotations

import importlib
from pathlib import Path

BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "speed" / "data_pipeline.py"


def _rows(lines: list[str], first: str) -> list[list[str]]:
    """The cells of the table rows whose first cell is ``first``."""
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines if line[:1] == "|"]
    return [row for row in rows if row[0] == first]


def _rows_starting(lines: list[str], prefix: str) -> list[list[str]]:
    """The cells of the table rows whose first cell starts with ``prefix``."""
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in lines if line[:1] == "|"]
    return [row for row in rows if row[0].startswith(prefix)]


def test_smoke_data_pipeline_tables(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARK.parent))
    module = importlib.import_module("data_pipeline")
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "unused-cache"))
    argv = ["--smoke", "--parts", "pipeline,resnet,rss,augment", "--rss-kinds", "domainnet"]
    argv += ["--work", str(tmp_path)]
    lines = module.main(argv)
    (fed,), (folder,) = _rows(lines, "fedshift"), _rows(lines, "ImageFolder")
    assert float(fed[2].replace(",", "")) > 0 and float(folder[2].replace(",", "")) > 0
    assert len(_rows(lines, "fedshift, no augmentation")) == 1
    assert any(line.startswith("fedshift/ImageFolder (median images/s): ") for line in lines)
    (cpu,) = _rows(lines, "cpu")
    assert float(cpu[3]) > 0
    (domainnet,) = _rows(lines, "DomainNet-sized")
    assert int(domainnet[1].replace(",", "")) == sum(
        max(4, int(tr * 0.001)) + max(2, int(te * 0.001))
        for tr, te in module.DOMAINNET_COUNTS.values()
    )
    assert float(domainnet[4].replace(",", "")) > 0
    assert len(list((tmp_path / "pacs-60" / "kfold" / "sketch").rglob("*.jpg"))) > 0
    for backend in ("pil", "batched", "fused"):
        ((_, device, _, median),) = _rows(lines, backend)
        assert device == "cpu" and float(median.replace(",", "")) > 0
    assert any(line.startswith("batched/pil on the CPU (median images/s): ") for line in lines)
    assert any(line.startswith("fused/pil on the CPU (median images/s): ") for line in lines)
    # the device comparison (CUDA when there is one) runs on the CPU at smoke sizes: kornia
    # and fused side by side against the model, each with its ratio
    (training,) = _rows_starting(lines, "ResNet-18 training")
    assert float(training[1].replace(",", "")) > 0
    for work in ("batched augmentation, kornia", "fused augmentation"):
        (row,) = _rows_starting(lines, work)
        assert float(row[1].replace(",", "")) > 0 and row[2].endswith("x")
    (summary,) = [line for line in lines if line.startswith("augmentation/training (samples/s): ")]
    assert "fused " in summary and "kornia " in summary and "fused/kornia " in summary
