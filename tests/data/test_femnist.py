"""LEAF FEMNIST on a generated tree in the release's exact layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fedshift.data import DatasetError, load_dataset
from fedshift.data.catalog import check_dataset
from fedshift.data.catalog.femnist import read_writers

WRITERS = {"f0001_12": (5, 2), "f0002_40": (4, 1), "f0003_07": (3, 0)}  # (train, test)


def _samples(writer: str, count: int, offset: int) -> dict:
    seed = sum(map(ord, writer)) + offset
    labels = [(seed + i) % 62 for i in range(count)]
    pixels = [[((seed + i) % 11) / 10.0] * 784 for i in range(count)]
    return {"x": pixels, "y": labels}


def _tree(root: Path) -> Path:
    for part, column, offset in (("train", 0, 0), ("test", 1, 100)):
        (root / part).mkdir(parents=True)
        users = [w for w, counts in WRITERS.items() if counts[column]]
        content = {
            "users": users,
            "num_samples": [WRITERS[w][column] for w in users],
            "user_data": {w: _samples(w, WRITERS[w][column], offset) for w in users},
        }
        (root / part / f"all_data_0_niid_0_keep_0_{part}_9.json").write_text(json.dumps(content))
    return root


def test_check_counts_writers_as_domains(tmp_path):
    counts, warnings = check_dataset("femnist", _tree(tmp_path))
    assert list(counts) == sorted(WRITERS)
    assert counts["f0001_12"]["test"] == 2 and counts["f0003_07"]["test"] == 0
    assert all(c["train"] + c["val"] == WRITERS[w][0] for w, c in counts.items())
    assert warnings == [
        "femnist: 3 writers, 15 samples; LEAF's full set has 3597 writers, 805263 samples"
    ]


def test_load_labels_shapes_and_one_client_per_writer(tmp_path):
    root = _tree(tmp_path / "leaf")
    ds = load_dataset("femnist", data_root=root)
    assert ds.domain_names == sorted(WRITERS) and ds.num_classes == 62
    assert ds.channels == 1 and ds.image_size == 28 and ds.classes[10] == "A"
    writers = read_writers(root)
    for name, domain in ds.domains.items():
        assert len(domain.train) + len(domain.val) == WRITERS[name][0]
        assert tuple(domain.train.x.shape[1:]) == (1, 28, 28)
        expected = writers[name]["test"][1]
        assert domain.test.y.tolist() == expected.tolist()
        pixels = _samples(name, WRITERS[name][0], 0)
        values = {round(v[0] * 255) for v in pixels["x"]}
        assert {int(v) for v in domain.train.x[:, 0, 0, 0]} <= values
    only = load_dataset("femnist:f0002_40", data_root=root, image_size=32)
    assert only.domain_names == ["f0002_40"] and only.image_size == 32


@pytest.mark.parametrize(
    ("breakage", "match"),
    [
        ("label", r"user 'f0002_40': labels must be integers 0\.\.61"),
        ("count", r"user 'f0001_12': num_samples says 9, the data holds 5"),
        ("json", r"JSON file .*train_9\.json is not valid JSON"),
    ],
)
def test_a_broken_copy_is_one_clear_line(tmp_path, breakage, match):
    root = _tree(tmp_path)
    path = root / "train" / "all_data_0_niid_0_keep_0_train_9.json"
    if breakage == "json":
        path.write_text(path.read_text()[:-20])
    else:
        content = json.loads(path.read_text())
        if breakage == "label":
            content["user_data"]["f0002_40"]["y"][1] = 62
        else:
            content["num_samples"][0] = 9
        path.write_text(json.dumps(content))
    with pytest.raises(DatasetError, match=match) as info:
        check_dataset("femnist", root)
    assert "\n" not in str(info.value)


def test_json_above_the_size_bound_is_refused(tmp_path, monkeypatch):
    from fedshift.data.formats import jsonfile

    root = _tree(tmp_path)
    monkeypatch.setattr(jsonfile, "MAX_JSON_BYTES", 100)
    with pytest.raises(DatasetError, match=r"train_9\.json is .* bytes, above the 100-byte bound"):
        check_dataset("femnist", root)
