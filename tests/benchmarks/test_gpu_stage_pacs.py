"""benchmarks/gpu/gpu_stage_pacs.py: a dataset copy split into parts that each fit one device
call."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu"


@pytest.fixture
def stage(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("gpu_stage_pacs")


@pytest.fixture
def repo(tmp_path):
    path = tmp_path / "repo"
    path.mkdir()
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def _tree(root: Path) -> dict[str, bytes]:
    """A small copy in PACS's layout: lists at the top, images two folders down."""
    contents = {
        "sketch_test_kfold.txt": b"sketch/dog/1.png 1\n" * 3,
        "kfold/sketch/dog/1.png": bytes(range(40)),
        "kfold/sketch/dog/2.png": bytes(30),
        "kfold/photo/horse/a.jpg": b"\xff\xd8" + bytes(45),
        "kfold/photo/horse/b.jpg": b"\xff\xd8" + bytes(10),
    }
    for name, data in contents.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return contents


def test_every_file_lands_in_exactly_one_part_within_the_limit(stage, repo, tmp_path, capsys):
    root = tmp_path / "PACS"
    contents = _tree(root)
    limit_mb = 60e-6  # 60 bytes a part: the 5 files (12-57 bytes) need 4 parts
    assert stage.main([str(root), "--max-mb", str(limit_mb), "--repo", str(repo)]) == 0
    parts = sorted(p for p in repo.glob(".stage*") if p.is_dir())
    assert len(parts) == 4
    seen: dict[str, bytes] = {}
    for part in parts:
        files = [p for p in part.rglob("*") if p.is_file()]
        assert sum(p.stat().st_size for p in files) <= 60
        for path in files:
            name = path.relative_to(part).as_posix()
            assert name not in seen
            seen[name] = path.read_bytes()
    assert seen == contents
    exclude = (repo / ".git" / "info" / "exclude").read_text().splitlines()
    assert [f"/.stage{k}/" for k in range(1, 5)] == [line for line in exclude if "stage" in line]
    assert "5 files in 4 parts" in capsys.readouterr().out
    # a second run replaces the parts and adds no exclude line twice
    assert stage.main([str(root), "--repo", str(repo)]) == 0
    assert sorted(p.name for p in repo.glob(".stage*")) == [".stage1"]
    exclude = (repo / ".git" / "info" / "exclude").read_text().splitlines()
    assert exclude.count("/.stage1/") == 1


def test_bad_input_is_one_line_and_exit_2(stage, repo, tmp_path, capsys):
    root = tmp_path / "PACS"
    _tree(root)
    assert stage.main([str(root), "--max-mb", "20e-6", "--repo", str(repo)]) == 2
    assert "more than a part may hold" in capsys.readouterr().err
    assert stage.main([str(tmp_path / "missing"), "--repo", str(repo)]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert stage.main([str(root), "--max-mb", "0", "--repo", str(repo)]) == 2
    (tmp_path / "empty").mkdir()
    assert stage.main([str(tmp_path / "empty"), "--repo", str(repo)]) == 2
    assert not list(repo.glob(".stage*"))
