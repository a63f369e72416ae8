"""The ``real`` tier on MNIST as the mnist domain of Digit-Five: a copy holding ``mnist/``
alone (the four official idx files) is checked and read as ``digit-five:mnist``.

Runs when ``$FEDSHIFT_REAL_DATA`` names a folder holding ``digit-five/mnist/`` (``.ci/run``
points it at ``../shared/datasets``), and is skipped with the reason otherwise.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedshift.cli import main
from fedshift.data import load_dataset
from fedshift.data.catalog import check_dataset
from fedshift.data.formats.idx import find_idx, read_idx

pytestmark = pytest.mark.real

#: the official MNIST files' images per class, digits 0..9 (LeCun et al.)
TRAIN_CLASS_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]


def test_check_counts_the_official_files(mnist_root, capsys):
    assert check_dataset("digit-five", mnist_root, ["mnist"]) == (
        {"mnist": {"train": 60_000, "test": 10_000}},
        [],
    )
    assert main(["datasets", "check", "digit-five:mnist", "--root", str(mnist_root)]) == 0
    captured = capsys.readouterr()
    assert captured.out == "mnist: train 60000, test 10000\n" and captured.err == ""
    path = find_idx(mnist_root / "mnist", "train-labels-idx1-ubyte", "the official MNIST files")
    (count,), labels = read_idx(path, "labels", False)
    digits = np.frombuffer(labels, dtype=np.uint8)
    assert count == 60_000 and np.bincount(digits, minlength=10).tolist() == TRAIN_CLASS_COUNTS


def test_load_follows_the_kd3a_caps(mnist_root, tmp_path):
    ds = load_dataset("digit-five:mnist", data_root=mnist_root, cache_dir=tmp_path)
    mnist = ds.domains["mnist"]
    assert list(ds.domains) == ["mnist"] and ds.meta["count_warnings"] == []
    assert len(mnist.train) + len(mnist.val) == 25_000 and len(mnist.test) == 9_000
    assert ds.meta["sample"]["mnist"] == {
        "train_file": 60_000,
        "train_used": 25_000,
        "test_file": 10_000,
        "test_used": 9_000,
        "files": "folder",
    }
    assert tuple(mnist.test.x.shape[1:]) == (3, 32, 32)
