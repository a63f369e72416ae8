"""Camelyon17-WILDS on a generated tree in the release's exact layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from fedshift.data import DatasetError, load_dataset
from fedshift.data.catalog import check_dataset

HEADER = ",patient,node,x_coord,y_coord,tumor,slide,center,split"
#: center -> (patients, rows per patient); centers 0 and 3 have WILDS val rows
PER_CENTER = 4


def _tree(root: Path) -> Path:
    lines = [HEADER]
    index = 0
    for center in range(5):
        for i in range(PER_CENTER):
            patient, node, x, y = 10 * center + 1, i % 2, 100 + i, 200 + i
            tumor = i % 2
            split = 1 if center in (0, 3) and i == 0 else 0
            folder = root / "patches" / f"patient_{patient:03d}_node_{node}"
            folder.mkdir(parents=True, exist_ok=True)
            name = f"patch_patient_{patient:03d}_node_{node}_x_{x}_y_{y}.png"
            Image.new("RGB", (96, 96), (40 * center, 200 * tumor, i)).save(folder / name)
            lines.append(f"{index},{patient},{node},{x},{y},{tumor},{patient},{center},{split}")
            index += 1
    (root / "metadata.csv").write_text("\n".join(lines) + "\n")
    return root


def test_check_counts_per_hospital_and_warns_on_a_small_copy(tmp_path):
    counts, warnings = check_dataset("camelyon17", _tree(tmp_path))
    assert list(counts) == [f"hospital{c}" for c in range(5)]
    assert counts["hospital0"] == {"train": 3, "val": 1, "test": 4}  # WILDS's split column
    assert counts["hospital1"] == {"train": 2, "val": 2, "test": 4}  # a seeded holdout
    assert len(warnings) == 5 and "hospital4: 4 images, the official copy has 146722" in warnings[4]


def test_load_labels_shapes_and_target_test_is_the_whole_hospital(tmp_path):
    root = _tree(tmp_path / "c17")
    ds = load_dataset("camelyon17", data_root=root, cache_dir=tmp_path / "cache")
    assert ds.classes == ["normal", "tumor"] and ds.image_size == 96
    counts, _ = check_dataset("camelyon17", root)
    for name, domain in ds.domains.items():
        assert {s: len(domain.split(s)) for s in ("train", "val", "test")} == counts[name]
        test = domain.test
        assert tuple(test.x.shape) == (PER_CENTER, 3, 96, 96)
        for row in range(len(test)):  # green encodes the label, red the hospital
            assert int(test.x[row][1, 0, 0]) == 200 * int(test.y[row])
            assert int(test.x[row][0, 0, 0]) == 40 * int(name[-1])
    assert torch.equal(ds.domains["hospital3"].val.y, torch.tensor([0]))


@pytest.mark.parametrize(
    ("breakage", "match"),
    [
        ("missing file", r"metadata\.csv line 4 names a missing file .*x_102_y_202\.png"),
        ("bad label", r"metadata\.csv line 3: tumor 2 is not in 0\.\.1"),
        ("bad header", r"metadata\.csv line 1: header lacks column\(s\) center"),
    ],
)
def test_a_broken_copy_is_one_clear_line(tmp_path, breakage, match):
    root = _tree(tmp_path)
    metadata = root / "metadata.csv"
    lines = metadata.read_text().splitlines()
    if breakage == "missing file":
        next(root.glob("patches/*/*_x_102_y_202.png")).unlink()
    elif breakage == "bad label":
        fields = lines[2].split(",")
        fields[5] = "2"
        lines[2] = ",".join(fields)
    else:
        lines[0] = lines[0].replace("center", "hospital")
    metadata.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=match) as info:
        check_dataset("camelyon17", root)
    assert "\n" not in str(info.value)
