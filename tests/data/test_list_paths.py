"""A dataset list someone sent cannot make a run read files outside the dataset's root:
absolute paths, ``..`` and symbolic links that lead out are refused naming file and line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PIL import Image

from fedshift.cli import main
from fedshift.data import DatasetError, load_dataset
from fedshift.data.catalog import CATALOG


def jpeg(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (200, 10, 10)).save(path, format="JPEG")


def pacs_tree(root: Path, outside_line: str) -> None:
    """A PACS copy in the kfold layout whose sketch train list ends with ``outside_line``."""
    for domain in CATALOG["pacs"].domains:
        rows = []
        for i in range(3):
            relative = f"{domain}/dog/pic_{i}.jpg"
            jpeg(root / "kfold" / relative)
            rows.append(f"{relative} 1")
        train = rows[:2] + ([outside_line] if domain == "sketch" else [])
        (root / f"{domain}_train_kfold.txt").write_text("\n".join(train) + "\n")
        (root / f"{domain}_crossval_kfold.txt").write_text(rows[2] + "\n")
        (root / f"{domain}_test_kfold.txt").write_text("\n".join(rows) + "\n")


@pytest.fixture
def secret(tmp_path) -> Path:
    """A real image outside the dataset's root."""
    path = tmp_path / "elsewhere" / "secret.jpg"
    jpeg(path)
    return path


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))


def escapes(root: Path, secret: Path) -> dict[str, str]:
    """List lines that each lead to ``secret``: by '..', absolute, and through a symlink."""
    (root / "kfold" / "sketch" / "dog").mkdir(parents=True, exist_ok=True)
    os.symlink(secret.parent, root / "kfold" / "sketch" / "dog" / "link")
    return {
        "dotdot": f"{os.path.relpath(secret, root / 'kfold')} 1",
        "absolute": f"{secret} 1",
        "symlink": "sketch/dog/link/secret.jpg 1",
    }


@pytest.mark.parametrize("kind", ["dotdot", "absolute", "symlink"])
def test_a_list_line_leading_out_of_the_root_is_refused(tmp_path, secret, kind, capsys):
    root = tmp_path / "PACS"
    (root / "kfold").mkdir(parents=True)
    line = escapes(root, secret)[kind]
    pacs_tree(root, line)
    with pytest.raises(DatasetError, match="sketch_train_kfold.txt line 3") as caught:
        load_dataset("pacs", data_root=root, image_size=8)
    assert "relative" in str(caught.value) or "leads out of" in str(caught.value)
    assert main(["datasets", "check", "pacs", "--root", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sketch_train_kfold.txt line 3" in err[0], err


def test_a_symlinked_copy_of_the_whole_tree_still_loads(tmp_path):
    """Links are fine while they stay inside: a root that is itself a link, as users keep
    datasets on another disk."""
    real = tmp_path / "disk" / "PACS"
    (real / "kfold").mkdir(parents=True)
    pacs_tree(real, "sketch/dog/pic_0.jpg 1")
    os.symlink(real, tmp_path / "PACS")
    ds = load_dataset("pacs", data_root=tmp_path / "PACS", image_size=8)
    assert len(ds.domains["sketch"].train) == 3
