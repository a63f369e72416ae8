"""``NAME:domain,...`` checks and reads only the named domains' files: each catalog family on a
generated copy that holds one domain only (what a user with, say, only MNIST of Digit-Five
has), while the whole copy is still demanded when every domain is used."""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fedshift.cli import main
from fedshift.config import check_preset, check_preset_data
from fedshift.data import DatasetError, load_dataset
from fedshift.data.catalog import CATALOG, check_dataset, split_name
from fedshift.presets import load_preset

MNIST_TRAIN, MNIST_TEST = 40, 20  # digits cycling 0..9: 4 and 2 per class


@pytest.fixture(autouse=True)
def image_cache(tmp_path, monkeypatch) -> Path:
    """Each test's own image cache (``$FEDSHIFT_CACHE``), never the user's."""
    folder = tmp_path / "fedshift-cache"
    monkeypatch.setenv("FEDSHIFT_CACHE", str(folder))
    return folder


def _mnist_only(root: Path) -> Path:
    """A Digit-Five root holding ``mnist/`` alone: the four idx files (train gzipped)."""
    folder = root / "mnist"
    folder.mkdir(parents=True)
    for prefix, count, suffix in (("train", MNIST_TRAIN, ".gz"), ("t10k", MNIST_TEST, "")):
        labels = (np.arange(count) % 10).astype(np.uint8)
        images = struct.pack(">IIII", 2051, count, 28, 28) + np.repeat(labels, 28 * 28).tobytes()
        label_bytes = struct.pack(">II", 2049, count) + labels.tobytes()
        write = gzip.compress if suffix else bytes
        (folder / f"{prefix}-images-idx3-ubyte{suffix}").write_bytes(write(images))
        (folder / f"{prefix}-labels-idx1-ubyte{suffix}").write_bytes(write(label_bytes))
    return root


def _jpeg(path: Path, red: int = 200) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (red, 30, 30)).save(path, format="JPEG")


def _one_line_error(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fedshift: error: "), err
    return err


def test_digit_five_mnist_alone_is_checked_and_loaded(tmp_path):
    root = _mnist_only(tmp_path / "d5")
    counts, warnings = check_dataset("digit-five", root, ["mnist"])
    assert counts == {"mnist": {"train": MNIST_TRAIN, "test": MNIST_TEST}}
    assert warnings == [
        "digit-five/mnist: train file has 40 images, the official copy has 60000",
        "digit-five/mnist: test file has 20 images, the official copy has 10000",
    ]
    ds = load_dataset("digit-five:mnist", data_root=root)
    assert ds.name == "digit-five:mnist" and list(ds.domains) == ["mnist"]
    mnist = ds.domains["mnist"]
    assert (len(mnist.train), len(mnist.val), len(mnist.test)) == (30, 10, 20)  # 1 per class val
    assert mnist.val.y.sort().values.tolist() == list(range(10))
    assert mnist.test.y.tolist() == [i % 10 for i in range(MNIST_TEST)]
    assert tuple(mnist.test.x.shape) == (MNIST_TEST, 3, 32, 32)
    with pytest.raises(DatasetError, match=r"missing folder .*d5/mnistm"):
        check_dataset("digit-five", root)  # every domain: the whole copy is demanded
    with pytest.raises(DatasetError, match=r"missing folder .*d5/mnistm"):
        load_dataset("digit-five", data_root=root)


def test_cli_checks_one_domain_and_names_an_unknown_one(tmp_path, capsys):
    root = str(_mnist_only(tmp_path / "d5"))
    assert main(["datasets", "check", "digit-five:mnist", "--root", root]) == 0
    captured = capsys.readouterr()
    assert captured.out == "mnist: train 40, test 20\n"
    assert captured.err.count("fedshift: warning: digit-five/mnist:") == 2
    err = _one_line_error(["datasets", "check", "digit-five:mnsit", "--root", root], capsys)
    assert err == (
        "fedshift: error: unknown domain 'mnsit' of digit-five (did you mean 'mnist'?); "
        "its domains: mnist, mnistm, svhn, usps, syn\n"
    )
    err = _one_line_error(["datasets", "check", "digit-fiv:mnist", "--root", root], capsys)
    assert "unknown dataset 'digit-fiv' (did you mean 'digit-five'?)" in err
    err = _one_line_error(["datasets", "check", "digit-five", "--root", root], capsys)
    assert "missing folder" in err and "mnistm" in err


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("digit-five:", "no domains listed after 'digit-five:'; its domains: mnist, mnistm"),
        ("digit-five:mnist,mnist", "domain 'mnist' is listed twice in digit-five:mnist,mnist"),
        ("pacs:Photo", "unknown domain 'Photo' of pacs (did you mean 'photo'?)"),
        ("office-home:real world", "(did you mean 'Real World'?)"),
        ("cifar10:svhn", "unknown domain 'svhn' of cifar10; its domains: cifar10"),
    ],
)
def test_domain_lists_are_checked_before_any_file_is_read(spec, message, tmp_path):
    name, domains = split_name(spec)
    with pytest.raises(DatasetError) as raised:
        check_dataset(name, tmp_path / "absent", domains)
    assert message in str(raised.value)


def test_split_name():
    assert split_name("pacs") == ("pacs", None)
    assert split_name("pacs:photo, sketch,") == ("pacs", ["photo", "sketch"])
    assert split_name("digit-five:") == ("digit-five", [])


def test_the_fedproto_mnist_preset_checks_only_mnist(tmp_path):
    cfg = check_preset(load_preset("fedproto-mnist"))
    assert cfg.dataset == "digit-five:mnist"
    cfg.data_root = str(_mnist_only(tmp_path / "d5"))
    check_preset_data(cfg)  # raised "missing folder .../mnistm" before
    cfg.dataset = "digit-five"
    with pytest.raises(DatasetError, match="missing folder"):
        check_preset_data(cfg)


def test_pacs_one_domain_with_its_lists_only(tmp_path):
    root = tmp_path / "PACS"
    lines = []
    for i, label in enumerate((1, 2, 1)):
        name = f"photo/{CATALOG['pacs'].classes[label - 1]}/{i}.jpg"
        _jpeg(root / "kfold" / name, 40 * i)
        lines.append(f"{name} {label}")
    (root / "photo_train_kfold.txt").write_text("\n".join(lines[:2]) + "\n")
    (root / "photo_crossval_kfold.txt").write_text(lines[2] + "\n")
    (root / "photo_test_kfold.txt").write_text("\n".join(lines) + "\n")
    counts, warnings = check_dataset("pacs", root, ["photo"])
    assert counts == {"photo": {"train": 2, "val": 1, "test": 3}}
    assert warnings == ["pacs/photo: 3 images, the official copy has 1670"]
    ds = load_dataset("pacs:photo", data_root=root, image_size=8)
    assert list(ds.domains) == ["photo"]
    assert ds.domains["photo"].train.y.tolist() == [0, 1]
    assert ds.domains["photo"].test.y.tolist() == [0, 1, 0]
    with pytest.raises(DatasetError, match="missing domain folder .*art_painting"):
        check_dataset("pacs", root)


def test_class_folder_domain_alone_finds_its_classes(tmp_path):
    for cls in ("Bike", "Alarm_Clock"):
        for i in range(2):
            _jpeg(tmp_path / "Real World" / cls / f"{i}.jpg")
    counts, warnings = check_dataset("office-home", tmp_path, ["Real World"])
    assert counts == {"Real World": {"train": 2, "val": 2, "test": 4}}
    assert warnings == ["office-home/Real World: 4 images, the official copy has 4357"]
    ds = load_dataset("office-home:Real World", data_root=tmp_path, image_size=8)
    assert ds.classes == ["Alarm_Clock", "Bike"] and list(ds.domains) == ["Real World"]
    with pytest.raises(DatasetError, match="missing domain folder .*Art"):
        check_dataset("office-home", tmp_path)


def test_domainnet_domain_alone_reads_its_own_lists(tmp_path):
    train = ["real/bird/b.jpg", "real/zebra/z.jpg"]
    for image in [*train, "real/zebra/t.jpg"]:
        _jpeg(tmp_path / image)
    (tmp_path / "real_train.txt").write_text("".join(f"{p} {i}\n" for i, p in enumerate(train)))
    (tmp_path / "real_test.txt").write_text("real/zebra/t.jpg 1\n")
    counts, _ = check_dataset("domainnet", tmp_path, ["real"])
    assert counts == {"real": {"train": 2, "val": 0, "test": 1}}
    ds = load_dataset("domainnet:real", data_root=tmp_path, image_size=8)
    assert ds.classes == ["bird", "zebra"] and ds.domains["real"].test.y.tolist() == [1]
    counts, _ = check_dataset("domainnet10", tmp_path, ["real"])
    assert counts == {"real": {"train": 2, "val": 0, "test": 1}}
    with pytest.raises(DatasetError, match="missing split list .*clipart_train.txt"):
        check_dataset("domainnet", tmp_path)


def test_segmentation_site_alone(tmp_path):
    folder = tmp_path / "HK"
    folder.mkdir()
    for i in range(5):
        array = np.zeros((16, 16, 2), dtype=np.float32)
        array[..., 0] = 100.0 + i
        array[4:8, 4:8, 1] = 1
        np.save(folder / f"Case00_slice{i}.npy", array)
    counts, warnings = check_dataset("prostate", tmp_path, ["HK"])
    assert counts == {"HK": {"train": 4, "val": 1, "test": 5}} and warnings == []
    ds = load_dataset("prostate:HK", data_root=tmp_path, image_size=16)
    assert list(ds.domains) == ["HK"] and len(ds.domains["HK"].test) == 5
    with pytest.raises(DatasetError, match="missing site folder .*BIDMC"):
        check_dataset("prostate", tmp_path)


def test_camelyon17_hospital_needs_only_its_patches(tmp_path):
    lines = [",patient,node,x_coord,y_coord,tumor,slide,center,split"]
    for center in range(5):
        for i in range(4):
            patient, x, y = 10 * center + 1, 100 + i, 200 + i
            name = f"patch_patient_{patient:03d}_node_0_x_{x}_y_{y}.png"
            if center == 2:  # the only hospital whose patches are here
                folder = tmp_path / "patches" / f"patient_{patient:03d}_node_0"
                folder.mkdir(parents=True, exist_ok=True)
                Image.new("RGB", (96, 96), (0, 200 * (i % 2), i)).save(folder / name)
            split = int(i == 0)
            lines.append(f"{len(lines) - 1},{patient},0,{x},{y},{i % 2},{patient},{center},{split}")
    (tmp_path / "metadata.csv").write_text("\n".join(lines) + "\n")
    counts, warnings = check_dataset("camelyon17", tmp_path, ["hospital2"])
    assert counts == {"hospital2": {"train": 3, "val": 1, "test": 4}}
    assert warnings == ["camelyon17/hospital2: 4 images, the official copy has 85054"]
    ds = load_dataset("camelyon17:hospital2", data_root=tmp_path, image_size=8)
    assert sorted(ds.domains["hospital2"].test.y.tolist()) == [0, 0, 1, 1]
    with pytest.raises(DatasetError, match="metadata.csv line 2 names a missing file"):
        check_dataset("camelyon17", tmp_path)


def test_femnist_writers_are_picked_from_the_copy(tmp_path):
    for part, count in (("train", 3), ("test", 1)):
        users = ["f0001_12", "f0002_40"]
        data = {u: {"x": [[0.5] * 784] * count, "y": [7] * count} for u in users}
        content = {"users": users, "num_samples": [count] * 2, "user_data": data}
        (tmp_path / part).mkdir()
        (tmp_path / part / f"{part}.json").write_text(json.dumps(content))
    counts, warnings = check_dataset("femnist", tmp_path, ["f0002_40"])
    assert counts == {"f0002_40": {"train": 2, "val": 1, "test": 1}} and warnings == []
    assert len(check_dataset("femnist", tmp_path)[1]) == 1  # the whole copy against LEAF's
    ds = load_dataset("femnist:f0002_40,f0001_12", data_root=tmp_path)
    assert list(ds.domains) == ["f0002_40", "f0001_12"]
    with pytest.raises(DatasetError, match=r"unknown writer 'f0002_4' .*did you mean 'f0002_40'"):
        check_dataset("femnist", tmp_path, ["f0002_4"])
