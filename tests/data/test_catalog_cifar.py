"""CIFAR-10 / CIFAR-100 read from generated binary files with known pixels and labels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedshift.cli import main
from fedshift.data import DatasetError, load_dataset
from fedshift.data.catalog.cifar import CIFAR10_CLASSES

PER_CLASS_PER_FILE = 2


def _image(label: int, serial: int) -> np.ndarray:
    """A 3x32x32 image telling its label (red plane), serial (green) and channel (blue)."""
    image = np.empty((3, 32, 32), dtype=np.uint8)
    image[0] = label
    image[1] = serial % 256
    image[2] = np.arange(32, dtype=np.uint8)[None, :]  # the column: checks row-major HxW
    return image


def _write(path: Path, labels: list[int], serial: int, coarse: bool) -> int:
    """Records for ``labels`` (coarse label = fine // 5 first when ``coarse``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for label in labels:
        head = [label // 5, label] if coarse else [label]
        rows.append(np.concatenate([np.asarray(head, np.uint8), _image(label, serial).ravel()]))
        serial += 1
    np.stack(rows).tofile(path)
    return serial


def _cifar10(root: Path) -> None:
    serial = 0
    folder = root / "cifar-10-batches-bin"
    for i in range(1, 6):
        labels = [c for c in range(10) for _ in range(PER_CLASS_PER_FILE)]
        serial = _write(folder / f"data_batch_{i}.bin", labels, serial, False)
    _write(folder / "test_batch.bin", list(range(10)) * 3, 1000, False)


def _cifar100(root: Path, names: bool) -> None:
    folder = root / "cifar-100-binary"
    _write(folder / "train.bin", [c for c in range(100) for _ in range(5)], 0, True)
    _write(folder / "test.bin", list(range(100)), 1000, True)
    if names:
        (folder / "fine_label_names.txt").write_text(
            "\n".join(f"name{i}" for i in range(100)) + "\n"
        )


def _check_pixels(split) -> None:
    x = split.x
    assert x.dtype == torch.uint8 and tuple(x.shape[1:]) == (3, 32, 32)
    assert torch.equal(x[:, 0, 0, 0].long(), split.y)  # red plane = label: CHW, label aligned
    assert torch.equal(x[:, 2, 5], torch.arange(32, dtype=torch.uint8).expand(len(x), 32))
    assert bool((x[:, 0] == x[:, 0, :1, :1]).all())  # planes are uniform where they should be


def test_cifar10_official_splits_labels_and_planes(tmp_path):
    _cifar10(tmp_path)
    ds = load_dataset("cifar10", data_root=tmp_path, seed=0)
    assert ds.classes == list(CIFAR10_CLASSES) and ds.classes[0] == "airplane"
    assert list(ds.domains) == ["cifar10"] and ds.image_size == 32
    domain = ds.domains["cifar10"]
    assert (len(domain.train), len(domain.val), len(domain.test)) == (80, 20, 30)
    assert torch.bincount(domain.val.y).tolist() == [2] * 10  # stratified 0.2 per class
    for split in (domain.train, domain.val, domain.test):
        _check_pixels(split)
    serials = torch.cat([domain.train.x[:, 1, 0, 0], domain.val.x[:, 1, 0, 0]]).long()
    assert sorted(serials.tolist()) == list(range(100))  # every train record exactly once
    assert ds.meta["counts"] == {"cifar10": {"train": 80, "val": 20, "test": 30}}
    assert "split_seed=0" in ds.meta["split"] and ds.meta["augment"] == "none"
    other = load_dataset("cifar10", data_root=tmp_path, seed=1).domains["cifar10"]
    assert not torch.equal(other.val.x, domain.val.x)
    small = load_dataset("cifar10", data_root=tmp_path, image_size=16).domains["cifar10"]
    assert tuple(small.test.x.shape) == (30, 3, 16, 16)
    assert torch.equal(small.test.x[:, 0, 3, 3].long(), small.test.y)  # uniform plane stays


@pytest.mark.parametrize("names", [True, False])
def test_cifar100_fine_labels_and_names(tmp_path, names):
    _cifar100(tmp_path, names)
    ds = load_dataset("cifar100", data_root=tmp_path)
    assert ds.num_classes == 100
    assert ds.classes[7] == ("name7" if names else "class_07")
    domain = ds.domains["cifar100"]
    assert (len(domain.train), len(domain.val), len(domain.test)) == (400, 100, 100)
    assert sorted(domain.test.y.tolist()) == list(range(100))  # fine, not coarse (0..19)
    for split in (domain.train, domain.val, domain.test):
        _check_pixels(split)


def test_broken_cifar_copies_are_one_line_errors(tmp_path):
    _cifar10(tmp_path)
    batch = tmp_path / "cifar-10-batches-bin" / "data_batch_3.bin"
    batch.write_bytes(batch.read_bytes()[:-100])
    with pytest.raises(DatasetError, match="data_batch_3.bin is .* not a whole number") as info:
        load_dataset("cifar10", data_root=tmp_path)
    assert "\n" not in str(info.value)
    batch.unlink()
    with pytest.raises(DatasetError, match="missing file .*data_batch_3.bin"):
        load_dataset("cifar10", data_root=tmp_path)
    with pytest.raises(DatasetError, match="missing folder .*cifar-100-binary"):
        load_dataset("cifar100", data_root=tmp_path)
    with pytest.raises(DatasetError, match="split_files does not apply"):
        load_dataset("cifar10", data_root=tmp_path, split_files=tmp_path)


def test_cifar_augment_pads_crops_and_flips_from_the_generator():
    from fedshift.data.augment import CifarAugment

    images = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    augment = CifarAugment()
    first = augment(images, torch.Generator().manual_seed(1))
    assert first.shape == images.shape and first.dtype == torch.uint8
    assert torch.equal(first, augment(images, torch.Generator().manual_seed(1)))
    assert not torch.equal(first, augment(images, torch.Generator().manual_seed(2)))
    padded = torch.nn.functional.pad(images.float(), (4, 4, 4, 4), mode="reflect").to(torch.uint8)
    for original, out in zip(padded, first, strict=True):  # each output is a window, maybe flipped
        windows = [original[:, t : t + 32, s : s + 32] for t in range(9) for s in range(9)]
        assert any(torch.equal(out, w) or torch.equal(out, w.flip(-1)) for w in windows)


def test_cifar10_dirichlet_personalized_cli_run(tmp_path):
    _cifar10(tmp_path / "data")

    def run(out: str, *settings: str) -> int:
        argv = ["run", "-d", "cifar10", "--protocol", "personalized", "--partition", "dirichlet"]
        argv += ["--rounds", "1", "--quiet", "--out", str(tmp_path / out)]
        argv += ["--clients-per-domain", "2"]
        for setting in ("threads=1", "batch_size=16", *settings):
            argv += ["--set", setting]
        return main(argv)

    data_root = f"data_root={tmp_path / 'data'}"
    assert run("run", data_root) == 0
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    meta = config["run_info"]["dataset_meta"]
    assert meta["counts"] == {"cifar10": {"train": 80, "val": 20, "test": 30}}
    assert "official train/test files" in meta["split"]
    assert config["run_info"]["inputs"]["augment"] == "none"
    assert run("r2", data_root, "augment=cifar") == 0
    inputs = json.loads((tmp_path / "r2" / "config.json").read_text())["run_info"]["inputs"]
    assert inputs["augment"] == "cifar"
    assert run("r3", "data_root=/nowhere") == 2
