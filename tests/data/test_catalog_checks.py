"""``datasets check`` verifies what a copy lists the same way for every image-list dataset:
every listed file exists, every label is in range (list and line named), every image's header
opens; and a run reading the same copy stops on the same line."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_catalog_digit_five import _tree as _digit_five_tree
from test_catalog_loaders import _domainnet_tree, _folder_tree

from fedshift.cli import main
from fedshift.data import DatasetError, load_dataset
from fedshift.data.catalog import check_dataset


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))


def _append(list_file: Path, line: str) -> int:
    """Add ``line`` to a split list; its line number."""
    rows = list_file.read_text().splitlines() + [line]
    list_file.write_text("\n".join(rows) + "\n")
    return len(rows)


def _check_and_run_fail(name: str, root: Path, match: str, capsys) -> None:
    with pytest.raises(DatasetError, match=match) as info:
        check_dataset(name, root)
    assert "\n" not in str(info.value)
    capsys.readouterr()
    assert main(["datasets", "check", name, "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    with pytest.raises(DatasetError, match=match):
        load_dataset(name, data_root=root, image_size=8)


def test_domainnet_check_finds_a_missing_listed_file(tmp_path, capsys):
    _domainnet_tree(tmp_path)
    line = _append(tmp_path / "painting_train.txt", "painting/zebra/gone.jpg 1")
    match = rf"painting_train\.txt line {line} names a missing file .*painting/zebra/gone\.jpg"
    _check_and_run_fail("domainnet", tmp_path, match, capsys)


def test_domainnet_check_finds_a_label_out_of_range(tmp_path, capsys):
    _domainnet_tree(tmp_path)
    (tmp_path / "real" / "moon").mkdir()
    (tmp_path / "real" / "zebra" / "real_001_000000.jpg").rename(tmp_path / "real/moon/m.jpg")
    line = _append(tmp_path / "real_test.txt", "real/moon/m.jpg 7")
    match = rf"real_test\.txt line {line}: label 7 is out of range: no list line uses label 3"
    _check_and_run_fail("domainnet", tmp_path, match, capsys)


def test_domainnet_check_finds_a_label_of_another_class_folder(tmp_path, capsys):
    _domainnet_tree(tmp_path)
    line = _append(tmp_path / "sketch_test.txt", "sketch/zebra/sketch_001_000000.jpg 7")
    match = rf"sketch_test\.txt line {line}: label 7 for folder 'zebra', which is label 1 at "
    _check_and_run_fail("domainnet", tmp_path, match, capsys)


@pytest.mark.parametrize("name", ["domainnet", "domainnet10"])
def test_domainnet_check_opens_every_listed_image(tmp_path, capsys, name):
    _domainnet_tree(tmp_path)
    broken = tmp_path / "quickdraw" / "bird" / "quickdraw_002_000001.jpg"
    broken.write_bytes(broken.read_bytes()[:20])
    _check_and_run_fail(
        name, tmp_path, r"unreadable image file .*quickdraw_002_000001\.jpg", capsys
    )


@pytest.mark.parametrize("name", ["office-home", "office31"])
def test_class_folder_check_opens_every_image(tmp_path, capsys, name):
    _folder_tree(name, tmp_path)
    broken = next(tmp_path.glob("*/**/car/*_003.jpg"))
    broken.write_bytes(b"<html>403 Forbidden</html>")
    _check_and_run_fail(name, tmp_path, rf"unreadable image file .*{broken.name}", capsys)


def test_digit_five_check_opens_every_mnistm_image(tmp_path, capsys):
    root = _digit_five_tree(tmp_path / "d5")
    broken = root / "mnistm" / "mnist_m_test" / "00000004.png"
    broken.write_bytes(broken.read_bytes()[:10])
    _check_and_run_fail("digit-five", root, r"unreadable image file .*00000004\.png", capsys)
