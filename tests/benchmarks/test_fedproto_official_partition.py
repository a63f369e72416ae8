"""benchmarks/fidelity/fedproto_official_partition.py: the official FedProto MNIST clients."""

from __future__ import annotations

import gzip
import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks" / "fidelity"
SCRIPT = BENCHMARKS / "fedproto_official_partition.py"
TRAIN_PER_CLASS, TEST_PER_CLASS = 2300, 800


@pytest.fixture
def official(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("fedproto_official_partition")


def sorted_labels(per_class: int) -> np.ndarray:
    return np.repeat(np.arange(10, dtype=np.uint8), per_class)


def test_client_i_takes_block_i_of_each_class_in_label_order(official):
    train, test = sorted_labels(TRAIN_PER_CLASS), sorted_labels(TEST_PER_CLASS)
    orders = (np.arange(len(train)), np.arange(len(test)))  # already sorted: identity order
    clients = official.official_clients(train, test, 3, 1234, orders)
    assert len(clients) == 20
    # the official n_list of seed 1234 at n = 3 (fedproto_official_draw.py prints it too)
    assert sorted(len(c) for c, _, _ in clients) == [2] * 5 + [3] * 4 + [4] * 6 + [5] * 5
    for i, (classes, train_idx, test_idx) in enumerate(clients):
        assert classes == sorted(set(classes))
        shots = len(train_idx) // len(classes)
        assert shots in (99, 100) and len(train_idx) == shots * len(classes)
        expected_train = [TRAIN_PER_CLASS * c + 110 * i + np.arange(shots) for c in classes]
        expected_test = [TEST_PER_CLASS * c + 40 * i + np.arange(40) for c in classes]
        assert np.array_equal(train_idx, np.concatenate(expected_train))
        assert np.array_equal(test_idx, np.concatenate(expected_test))


def test_an_order_that_does_not_sort_the_labels_is_refused(official):
    labels = np.array([2, 0, 1, 0], dtype=np.uint8)
    official.check_order(np.array([1, 3, 2, 0]), labels, "ok")
    with pytest.raises(ValueError, match="does not sort"):
        official.check_order(np.array([0, 1, 2, 3]), labels, "x")
    with pytest.raises(ValueError, match="not a permutation"):
        official.check_order(np.array([1, 1, 2, 0]), labels, "x")


def write_labels(root: Path) -> None:
    """The two MNIST label files (idx1, gzip) of a small copy with unsorted labels."""
    (root / "mnist").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for stem, per_class in (("train", TRAIN_PER_CLASS), ("t10k", TEST_PER_CLASS)):
        labels = rng.permutation(sorted_labels(per_class))
        header = (2049).to_bytes(4, "big") + len(labels).to_bytes(4, "big")
        with gzip.open(root / "mnist" / f"{stem}-labels-idx1-ubyte.gz", "wb") as f:
            f.write(header + labels.tobytes())


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False
    )


def test_write_order_then_read_it_back_and_bad_input_is_one_line(tmp_path):
    write_labels(tmp_path / "d5")
    order = tmp_path / "order.npz"
    done = run_script(str(tmp_path / "d5"), "--write-order", str(order))
    assert done.returncode == 0, done.stderr
    with np.load(order) as saved:
        assert sorted(saved.files) == ["t10k", "train"] and len(saved["train"]) == 23000
    bad = tmp_path / "bad.npz"
    np.savez(bad, train=np.arange(23000), t10k=np.arange(8000))
    cases = [
        ((str(tmp_path / "d5"), str(tmp_path / "run"), "--order", str(bad)), "does not sort"),
        ((str(tmp_path / "d5"), str(tmp_path / "run"), "--set", "rounds"), "KEY=VALUE"),
        ((str(tmp_path / "none"), str(tmp_path / "run")), "cannot read the MNIST label files"),
    ]
    for args, message in cases:
        done = run_script(*args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1, (args, done.stderr)
        assert lines[0].startswith("error: ") and message in lines[0], lines
    assert not (tmp_path / "run").exists()
