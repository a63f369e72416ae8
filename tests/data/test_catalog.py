"""The dataset catalog checker on generated trees in the authors' exact layouts."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from fedshift.cli import main
from fedshift.data import DatasetError
from fedshift.data.catalog import CATALOG, FOLDER_DATASETS, check_dataset


def _jpeg(path: Path) -> None:
    """A real 8x8 JPEG: the PACS check opens every listed image."""
    Image.new("RGB", (8, 8), (200, 30, 30)).save(path, format="JPEG")


def _pacs_tree(root: Path, per_domain: int = 3) -> None:
    for domain in CATALOG["pacs"].domains:
        folder = root / "kfold" / domain / "dog"
        folder.mkdir(parents=True)
        lines = []
        for i in range(per_domain):
            _jpeg(folder / f"{i}.jpg")
            lines.append(f"{domain}/dog/{i}.jpg 1")
        (root / f"{domain}_train_kfold.txt").write_text("\n".join(lines[:2]) + "\n")
        (root / f"{domain}_crossval_kfold.txt").write_text(lines[2] + "\n")
        (root / f"{domain}_test_kfold.txt").write_text("\n".join(lines) + "\n")


def test_pacs_counts_follow_the_official_lists_and_warn_on_a_short_copy(tmp_path):
    _pacs_tree(tmp_path)
    counts, warnings = check_dataset("pacs", tmp_path)
    assert counts["photo"] == {"train": 2, "val": 1, "test": 3}
    assert len(warnings) == 4
    assert "photo: 3 images, the official copy has 1670" in " ".join(warnings)


def test_missing_split_file_and_domain_are_one_line_errors(tmp_path):
    _pacs_tree(tmp_path)
    (tmp_path / "sketch_test_kfold.txt").unlink()
    with pytest.raises(DatasetError, match="missing split list .*sketch_test_kfold.txt"):
        check_dataset("pacs", tmp_path)
    _pacs_tree(tmp_path / "broken")
    (tmp_path / "broken" / "kfold" / "photo" / "dog" / "1.jpg").write_bytes(b"not a jpeg")
    with pytest.raises(DatasetError, match="unreadable image file .*photo/dog/1.jpg"):
        check_dataset("pacs", tmp_path / "broken")
    (tmp_path / "office").mkdir()
    with pytest.raises(DatasetError, match="missing domain folder .*Art"):
        check_dataset("office-home", tmp_path / "office")


def test_office_home_real_world_with_a_space(tmp_path):
    for domain in CATALOG["office-home"].domains:
        (tmp_path / domain / "Alarm_Clock").mkdir(parents=True)
        _jpeg(tmp_path / domain / "Alarm_Clock" / "00001.jpg")
    counts, _ = check_dataset("office-home", tmp_path)
    assert counts["Real World"] == {"train": 1, "val": 0, "test": 1}  # one image: nothing held out


def test_cifar10_binary_records_are_counted_without_unpickling(tmp_path):
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    for i in range(1, 6):
        (folder / f"data_batch_{i}.bin").write_bytes(bytes(3073 * 2))
    (folder / "test_batch.bin").write_bytes(bytes(3073))
    counts, warnings = check_dataset("cifar10", tmp_path)
    assert counts == {"cifar10": {"train": 10, "test": 1}}
    assert "11 images, the official copy has 60000" in warnings[0]


def test_cli_list_and_check(tmp_path, capsys):
    assert main(["datasets", "list"]) == 0
    assert "domainnet" in capsys.readouterr().out
    _pacs_tree(tmp_path)
    assert main(["datasets", "check", "pacs", "--root", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "art_painting: train 2, val 1, test 3" in captured.out
    assert "fedshift: warning: pacs/art_painting" in captured.err
    assert main(["datasets", "check", "nope", "--root", str(tmp_path)]) == 2


def test_domainnet_official_lists_and_the_fedbn_ten_class_subset(tmp_path):
    for domain in CATALOG["domainnet"].domains:
        train = [f"{domain}/bird/{domain}_001.jpg", f"{domain}/aircraft_carrier/a.jpg"]
        for image in [*train, f"{domain}/zebra/z.jpg"]:
            (tmp_path / image).parent.mkdir(parents=True, exist_ok=True)
            _jpeg(tmp_path / image)
        rows = [f"{image} {label}" for label, image in enumerate(train)]
        (tmp_path / f"{domain}_train.txt").write_text("\n".join(rows) + "\n")
        (tmp_path / f"{domain}_test.txt").write_text(f"{domain}/zebra/z.jpg 2\n")
    counts, _ = check_dataset("domainnet", tmp_path)
    assert counts["real"] == {"train": 2, "val": 0, "test": 1}  # one image per class: none held
    counts, warnings = check_dataset("domainnet10", tmp_path)
    assert counts["quickdraw"] == {"train": 1, "val": 0, "test": 1}
    assert warnings == []


def test_run_help_names_every_catalog_entry(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in CATALOG:
        assert name in text, name


def test_each_dataset_states_where_its_classes_come_from():
    for name, entry in CATALOG.items():
        line = entry.class_line()
        assert entry.class_source and "\n" not in line, name
        assert ("class folders found" in line) == (name in FOLDER_DATASETS), name
    assert "official lists" in CATALOG["domainnet"].class_line()
    assert CATALOG["domainnet10"].class_line().startswith("bird, feather, headphones")
    assert (
        "release" in CATALOG["cifar10"].class_line()
        and "airplane" in CATALOG["cifar10"].class_line()
    )
    assert "fine_label_names.txt" in CATALOG["cifar100"].class_line()
    assert CATALOG["pacs"].class_line().startswith("dog, elephant, giraffe")


def test_datasets_list_states_each_class_source(capsys):
    assert main(["datasets", "list"]) == 0
    listing = capsys.readouterr().out
    for entry in CATALOG.values():
        assert f"classes: {entry.class_line()}" in listing, entry.name
