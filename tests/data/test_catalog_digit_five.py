"""Digit-Five read from a generated tree in the public copies' formats: MNIST idx files (one
split gzipped), MNIST-M PNGs with label lists, SVHN and SynDigits ``.mat`` files, LIBSVM USPS.

Every image's red value is ``20 * digit + 5`` (gray images: every channel), so a decoded image
tells the label it must carry; colour images carry their row in the file as green.
"""

from __future__ import annotations

import bz2
import gzip
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from scipy.io import savemat

from fedshift.cli import main
from fedshift.data import DatasetError, load_dataset
from fedshift.data.catalog import CATALOG, check_dataset
from fedshift.data.catalog import digit_five as d5
from fedshift.data.lists import holdout

TRAIN_PER_CLASS = 4
TEST_PER_CLASS = 2
TRAIN = 10 * TRAIN_PER_CLASS
TEST = 10 * TEST_PER_CLASS


@pytest.fixture(autouse=True)
def image_cache(tmp_path, monkeypatch) -> Path:
    """Each test's own image cache (``$FEDSHIFT_CACHE``), never the user's."""
    folder = tmp_path / "fedshift-cache"
    monkeypatch.setenv("FEDSHIFT_CACHE", str(folder))
    return folder / "catalog"


def _red(digits) -> np.ndarray:
    return 20 * np.asarray(digits, dtype=np.int64) + 5


def _labels(count: int, offset: int = 0) -> np.ndarray:
    """Digits cycling 0..9 from ``offset``: row order differs from class order."""
    return (np.arange(count) + offset) % 10


def _colour_images(labels: np.ndarray, side: int) -> np.ndarray:
    """N x side x side x 3 uint8: red = the digit's value, green = the row, blue 77."""
    images = np.empty((len(labels), side, side, 3), dtype=np.uint8)
    images[..., 0] = _red(labels)[:, None, None]
    images[..., 1] = np.arange(len(labels))[:, None, None]
    images[..., 2] = 77
    return images


def _write_idx(path: Path, labels: np.ndarray, magic_images: int = 2051) -> None:
    count = len(labels)
    pixels = np.repeat(_red(labels).astype(np.uint8), 28 * 28)
    images = struct.pack(">IIII", magic_images, count, 28, 28) + pixels.tobytes()
    label_bytes = struct.pack(">II", 2049, count) + labels.astype(np.uint8).tobytes()
    image_name, label_name = path.name.split("|")
    path.parent.mkdir(parents=True, exist_ok=True)
    gz = image_name.endswith(".gz")
    writer = gzip.compress if gz else bytes
    (path.parent / image_name).write_bytes(writer(images))
    (path.parent / label_name).write_bytes(writer(label_bytes))


def _write_svhn_style(path: Path, labels: np.ndarray, zero_as_ten: bool) -> None:
    """SVHN format 2: X is 32 x 32 x 3 x N, y is N x 1 (10 for digit 0 when asked)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    y = np.where(labels == 0, 10, labels) if zero_as_ten else labels
    x = _colour_images(labels, 32).transpose(1, 2, 3, 0)
    savemat(str(path), {"X": x, "y": y.reshape(-1, 1).astype(np.uint8)})


def _write_usps(path: Path, labels: np.ndarray) -> None:
    """LIBSVM lines: digit + 1, then 256 values in [-1, 1]."""
    rows = []
    for digit in labels:
        value = float(_red([digit])[0] / 127.5 - 1.0)
        rows.append(f"{digit + 1} " + " ".join(f"{i}:{value!r}" for i in range(1, 257)))
    text = ("\n".join(rows) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bz2.compress(text) if path.suffix == ".bz2" else text)


def _write_mnistm(folder: Path, split: str, labels: np.ndarray) -> None:
    images = folder / f"mnist_m_{split}"
    images.mkdir(parents=True, exist_ok=True)
    lines = []
    for row, image in enumerate(_colour_images(labels, 28)):
        name = f"{row:08d}.png"
        Image.fromarray(image).save(images / name)
        lines.append(f"{name} {labels[row]}")
    (folder / f"mnist_m_{split}_labels.txt").write_text("\n".join(lines) + "\n")


def _tree(root: Path) -> Path:
    """Every domain with TRAIN / TEST images; test files start from digit 3."""
    train, test = _labels(TRAIN), _labels(TEST, 3)
    _write_idx(root / "mnist" / "train-images-idx3-ubyte|train-labels-idx1-ubyte", train)
    _write_idx(root / "mnist" / "t10k-images-idx3-ubyte.gz|t10k-labels-idx1-ubyte.gz", test)
    _write_mnistm(root / "mnistm", "train", train)
    _write_mnistm(root / "mnistm", "test", test)
    _write_svhn_style(root / "svhn" / "train_32x32.mat", train, True)
    _write_svhn_style(root / "svhn" / "test_32x32.mat", test, True)
    _write_svhn_style(root / "syn" / "synth_train_32x32.mat", train, False)
    _write_svhn_style(root / "syn" / "synth_test_32x32.mat", test, False)
    _write_usps(root / "usps" / "usps.bz2", train)
    _write_usps(root / "usps" / "usps.t", test)
    return root


def _check_labels_in_pixels(split, colour: bool) -> None:
    x = split.x
    assert x.dtype == torch.uint8 and tuple(x.shape[1:]) == (3, 32, 32)
    assert torch.equal(x[:, 0, 16, 16].long(), torch.from_numpy(_red(split.y.numpy())))
    assert bool((x[:, 0] == x[:, :1, :1, :1][:, 0]).all())  # uniform planes stay uniform
    if not colour:
        assert torch.equal(x[:, 1], x[:, 0]) and torch.equal(x[:, 2], x[:, 0])


def test_every_domain_splits_labels_and_official_test_file(tmp_path, capsys):
    root = _tree(tmp_path / "d5")
    ds = load_dataset("digit-five", data_root=root, seed=0)
    notes = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(notes) == 10 and notes == [
        f"fedshift: warning: {n}" for n in ds.meta["count_warnings"]
    ]
    assert (
        "fedshift: warning: digit-five/svhn: train file has 40 images, the official copy has 73257"
        in notes
    )
    assert list(ds.domains) == list(d5.DOMAINS) and ds.classes == [str(i) for i in range(10)]
    assert ds.image_size == 32 and ds.channels == 3
    held = round(0.2 * TRAIN_PER_CLASS)
    expected = {"train": TRAIN - 10 * held, "val": 10 * held, "test": TEST}
    assert ds.meta["counts"] == {d: expected for d in d5.DOMAINS}
    test_labels = torch.from_numpy(_labels(TEST, 3))
    for name, domain in ds.domains.items():
        colour = name in ("mnistm", "svhn", "syn")
        for split in (domain.train, domain.val, domain.test):
            _check_labels_in_pixels(split, colour)
        assert torch.bincount(domain.val.y, minlength=10).tolist() == [held] * 10
        assert torch.equal(domain.test.y, test_labels)  # the test file, in its order
        if colour:
            assert domain.test.x[:, 1, 0, 0].tolist() == list(range(TEST))
            rows = torch.cat([domain.train.x[:, 1, 0, 0], domain.val.x[:, 1, 0, 0]])
            assert sorted(rows.tolist()) == list(range(TRAIN))  # each train row once
    svhn = ds.domains["svhn"]
    assert int((svhn.train.y == 0).sum()) == TRAIN_PER_CLASS - held  # y = 10 read as digit 0
    assert "split_seed=0" in ds.meta["split"] and ds.meta["augment"] == "none"
    assert ds.meta["sample"]["usps"] == {
        "train_file": TRAIN,
        "train_used": TRAIN,
        "test_file": TEST,
        "test_used": TEST,
        "files": "folder",
    }
    assert ds.meta["image_cache"]["mnistm"].endswith(".npy")
    assert ds.meta["image_cache"]["svhn"] == ""


def test_caps_sample_the_train_file_by_seed_and_take_the_first_test_images(tmp_path):
    root = _tree(tmp_path / "d5")

    def load(seed: int):
        return d5.load_digit_five(
            root,
            image_size=32,
            seed=seed,
            holdout=lambda entries, domain: holdout(entries, 0.2, seed),
            val_fraction=0.2,
            meta={"root": str(root)},
            domains=["svhn", "mnistm"],
            cache_folder=None,
            train_cap=25,
            test_cap=7,
        )

    first, again, other = load(0), load(0), load(1)
    assert list(first.domains) == ["mnistm", "svhn"]
    for name, domain in first.domains.items():
        rows = torch.cat([domain.train.x[:, 1, 0, 0], domain.val.x[:, 1, 0, 0]]).tolist()
        assert len(rows) == len(set(rows)) == 25 and set(rows) <= set(range(TRAIN))
        assert domain.test.x[:, 1, 0, 0].tolist() == list(range(7))
        assert torch.equal(domain.train.x, again.domains[name].train.x)
        assert not torch.equal(domain.train.x, other.domains[name].train.x)
    assert first.meta["sample"]["svhn"]["train_used"] == 25
    assert first.meta["counts"]["mnistm"]["test"] == 7


def test_syn_number_mat_and_plain_files(tmp_path):
    root = _tree(tmp_path / "d5")
    for path in (root / "syn").iterdir():
        path.unlink()
    train, test = _labels(TRAIN), _labels(TEST, 3)
    savemat(
        str(root / "syn" / "syn_number.mat"),
        {
            "train_data": _colour_images(train, 32),
            "train_label": np.where(train == 0, 10, train).reshape(-1, 1).astype(np.uint8),
            "test_data": _colour_images(test, 32),
            "test_label": test.reshape(-1, 1).astype(np.uint8),
        },
    )
    (root / "usps" / "usps.bz2").rename(root / "usps" / "plain")
    (root / "usps" / "usps").write_bytes(bz2.decompress((root / "usps" / "plain").read_bytes()))
    ds = load_dataset("digit-five:syn,usps", data_root=root)
    assert list(ds.domains) == ["syn", "usps"]
    syn = ds.domains["syn"]
    for split in (syn.train, syn.val, syn.test):
        _check_labels_in_pixels(split, True)
    assert torch.equal(syn.test.y, torch.from_numpy(_labels(TEST, 3)))
    assert len(ds.domains["usps"].test) == TEST
    small = load_dataset("digit-five:mnist,mnistm,usps", data_root=root, image_size=16)
    for domain in small.domains.values():
        assert tuple(domain.test.x.shape[1:]) == (3, 16, 16)
        assert torch.equal(domain.test.x[:, 0, 8, 8].long(), torch.from_numpy(_red(domain.test.y)))
    with pytest.raises(DatasetError, match="split_files does not apply to digit-five"):
        load_dataset("digit-five", data_root=root, split_files=root)


def _one_hot(labels: np.ndarray) -> np.ndarray:
    return np.eye(10, dtype=np.uint8)[labels]


def _bundle(root: Path) -> Path:
    """M3SDA's Digit-Five .mat files (the ones KD3A and FACT read), all in ``root``."""
    root.mkdir(parents=True)
    train, test = _labels(TRAIN), _labels(TEST, 3)
    gray = {
        s: np.repeat(_red(y).astype(np.uint8), 32 * 32).reshape(-1, 32, 32)
        for s, y in (("train", train), ("test", test))
    }
    savemat(
        str(root / "mnist_data.mat"),
        {
            "train_32": gray["train"],
            "test_32": gray["test"],
            "label_train": _one_hot(train),
            "label_test": _one_hot(test),
        },
    )
    savemat(
        str(root / "mnistm_with_label.mat"),
        {
            "train": _colour_images(train, 28),
            "test": _colour_images(test, 28),
            "label_train": _one_hot(train),
            "label_test": _one_hot(test),
        },
    )
    _write_svhn_style(root / "svhn_train_32x32.mat", train, True)
    _write_svhn_style(root / "svhn_test_32x32.mat", test, True)
    savemat(
        str(root / "syn_number.mat"),
        {
            "train_data": _colour_images(train, 32),
            "train_label": train.reshape(-1, 1),
            "test_data": _colour_images(test, 32),
            "test_label": test.reshape(-1, 1),
        },
    )
    cell = np.empty((2, 2), dtype=object)
    for row, labels in enumerate((train, test)):
        cell[row, 0] = np.repeat((_red(labels) + 0.5) / 255.0, 28 * 28).reshape(-1, 1, 28, 28)
        cell[row, 1] = labels.reshape(-1, 1).astype(np.float64)
    savemat(str(root / "usps_28x28.mat"), {"dataset": cell})
    return root


def test_m3sda_bundle_of_mat_files(tmp_path, capsys):
    root = _bundle(tmp_path / "DigitFive")
    counts, warnings = check_dataset("digit-five", root)
    assert counts == {d: {"train": TRAIN, "test": TEST} for d in d5.DOMAINS}
    assert "digit-five/mnist: train file has 40 images, the official copy has 55000" in warnings
    ds = load_dataset("digit-five", data_root=root)
    assert {d: v["files"] for d, v in ds.meta["sample"].items()} == {
        d: "bundle" for d in d5.DOMAINS
    }
    for name, domain in ds.domains.items():
        for split in (domain.train, domain.val, domain.test):
            _check_labels_in_pixels(split, name in ("mnistm", "svhn", "syn"))
        assert torch.equal(domain.test.y, torch.from_numpy(_labels(TEST, 3)))
    assert ds.meta["image_cache"]["mnistm"] == ""  # arrays, not PNGs
    usps = _tree(tmp_path / "folders") / "usps"
    usps.rename(root / "usps")  # a domain folder beside the bundle: the folder is read
    assert check_dataset("digit-five", root)[0]["usps"] == {"train": TRAIN, "test": TEST}
    assert (
        load_dataset("digit-five:usps", data_root=root).meta["sample"]["usps"]["files"] == "folder"
    )
    labels = _one_hot(_labels(TEST, 3))
    labels[5] = 0
    savemat(
        str(root / "mnistm_with_label.mat"),
        {
            "train": _colour_images(_labels(TRAIN), 28),
            "test": _colour_images(_labels(TEST, 3), 28),
            "label_train": _one_hot(_labels(TRAIN)),
            "label_test": labels,
        },
    )
    with pytest.raises(
        DatasetError, match=r"mnistm_with_label\.mat: label_test is 20 x 10 but not one-hot"
    ):
        check_dataset("digit-five", root)
    (root / "mnist_data.mat").unlink()
    with pytest.raises(DatasetError, match=r"missing folder .*mnist .*or M3SDA's mnist_data\.mat"):
        check_dataset("digit-five", root)


def test_check_prints_counts_and_one_warning_line_per_file(tmp_path, capsys):
    root = _tree(tmp_path / "d5")
    counts, warnings = check_dataset("digit-five", root)
    assert counts == {d: {"train": TRAIN, "test": TEST} for d in d5.DOMAINS}
    assert len(warnings) == 10
    assert "digit-five/mnistm: test file has 20 images, the official copy has 9001" in warnings
    assert main(["datasets", "check", "digit-five", "--root", str(root)]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"{d}: train {TRAIN}, test {TEST}" for d in d5.DOMAINS]
    lines = err.splitlines()
    assert len(lines) == 10 and all(line.startswith("fedshift: warning: ") for line in lines)
    assert main(["datasets", "list"]) == 0
    listing = capsys.readouterr().out
    assert "digit-five  [32 px]" in listing and "fedshift run -d digit-five" in listing
    assert CATALOG["digit-five"].official_totals["svhn"] == 73257 + 26032


def _break(root: Path, what: str) -> None:
    if what == "missing svhn test file":
        (root / "svhn" / "test_32x32.mat").unlink()
    elif what == "missing mnistm folder":
        for path in (root / "mnistm" / "mnist_m_test").iterdir():
            path.unlink()
        (root / "mnistm" / "mnist_m_test").rmdir()
    elif what == "unreadable mat":
        (root / "syn" / "synth_train_32x32.mat").write_bytes(b"not a mat file" * 20)
    elif what == "mat without y":
        savemat(str(root / "svhn" / "train_32x32.mat"), {"X": np.zeros((32, 32, 3, 2), np.uint8)})
    elif what == "wrong magic":
        _write_idx(
            root / "mnist" / "train-images-idx3-ubyte|train-labels-idx1-ubyte",
            _labels(TRAIN),
            magic_images=2049,
        )
    elif what == "truncated idx":
        path = root / "mnist" / "train-images-idx3-ubyte"
        path.write_bytes(path.read_bytes()[:-50])
    elif what == "svhn label 11":
        _write_svhn_style(root / "svhn" / "test_32x32.mat", _labels(TEST) + 2, False)
    elif what == "mnist label 10":
        labels = _labels(TEST, 3)
        labels[4] = 10
        _write_idx(root / "mnist" / "t10k-images-idx3-ubyte.gz|t10k-labels-idx1-ubyte.gz", labels)
    elif what == "mnistm label 12":
        listing = root / "mnistm" / "mnist_m_train_labels.txt"
        listing.write_text(listing.read_text().replace("00000003.png 3", "00000003.png 12"))
    elif what == "usps label 11":
        _write_usps(root / "usps" / "usps.t", _labels(TEST) + 1)
    elif what == "usps bad value":
        path = root / "usps" / "usps.t"
        path.write_text(path.read_text() + "3 1:0.5 2:zero\n")
    elif what == "missing mnistm image":
        (root / "mnistm" / "mnist_m_test" / "00000002.png").unlink()


BROKEN = {
    "missing svhn test file": r"missing file .*svhn/test_32x32\.mat",
    "missing mnistm folder": r"missing MNIST-M image folder .*mnist_m_test",
    "unreadable mat": r"unreadable \.mat file .*synth_train_32x32\.mat",
    "mat without y": r"train_32x32\.mat has no variable 'y'",
    "wrong magic": r"train-images-idx3-ubyte has magic number 2049, expected 2051",
    "truncated idx": r"train-images-idx3-ubyte is truncated",
    "svhn label 11": r"test_32x32\.mat has label 11; digits 0\.\.10 expected",
    "mnist label 10": r"t10k-labels-idx1-ubyte\.gz has label 10; digits 0\.\.9 expected",
    "mnistm label 12": r"mnist_m_train_labels\.txt line 4: label 12 not in 0\.\.9",
    "usps label 11": r"usps\.t line 10: label 11 not in 1\.\.10",
    "usps bad value": r"usps\.t line 21: expected '<label 1\.\.10> <index 1\.\.256>:<value>",
    "missing mnistm image": r"names a missing file .*00000002\.png",
}


@pytest.mark.parametrize("what", list(BROKEN))
def test_a_broken_copy_is_one_line(tmp_path, capsys, what):
    root = _tree(tmp_path / "d5")
    _break(root, what)
    with pytest.raises(DatasetError, match=BROKEN[what]) as info:
        load_dataset("digit-five", data_root=root)
    assert "\n" not in str(info.value)
    capsys.readouterr()
    assert main(["datasets", "check", "digit-five", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and "Traceback" not in err
    assert errors[0].startswith("fedshift: error: ")


def test_digit_five_cli_run(tmp_path, capsys):
    root = _tree(tmp_path / "d5")
    out = tmp_path / "run"
    argv = ["run", "-a", "fedavg", "-d", "digit-five", "-t", "mnistm", "--rounds", "1"]
    argv += ["--quiet", "--out", str(out)]
    for setting in (f"data_root={root}", "threads=1", "batch_size=16"):
        argv += ["--set", setting]
    assert main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    info = config["run_info"]
    assert info["targets"] == ["mnistm"]
    assert info["dataset_meta"]["counts"]["usps"] == {"train": 30, "val": 10, "test": TEST}
    assert "KD3A/FACT" in info["dataset_meta"]["split"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "digit-five" and 0.0 <= summary["target_accuracy"] <= 1.0
    capsys.readouterr()
    missing_root = [*argv[:9], "--set", "data_root=/nowhere", "--out", str(tmp_path / "r2")]
    assert main(missing_root) == 2
    assert "Traceback" not in capsys.readouterr().err
