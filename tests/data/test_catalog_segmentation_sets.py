"""Fundus and Prostate (FedDG-ELCFS's release layout) read from generated ``.npy`` trees:
counts and the official-count warning, the split, the nested mask channels, one-line errors,
and 1-round CLI runs reporting Dice per channel."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedshift.cli import main
from fedshift.core.split import Split
from fedshift.data import DatasetError, load_dataset
from fedshift.data.catalog import CATALOG, check_dataset
from fedshift.data.catalog.elcfs import FUNDUS, PROSTATE
from fedshift.eval.segmentation import (
    channel_targets,
    dice,
    dice_per_channel,
    segmentation_loss,
    soft_dice_loss,
)

SIDE = 24
FUNDUS_FILES = {"client1": 3, "client2": 4, "client3": 5, "client4": 6}
PROSTATE_FILES = 4


@pytest.fixture(autouse=True)
def image_cache(tmp_path, monkeypatch) -> Path:
    """Each test's own image cache (``$FEDSHIFT_CACHE``), never the user's."""
    folder = tmp_path / "fedshift-cache"
    monkeypatch.setenv("FEDSHIFT_CACHE", str(folder))
    return folder / "catalog"


def _radius() -> np.ndarray:
    rows, cols = np.mgrid[:SIDE, :SIDE]
    return np.hypot(rows - SIDE / 2, cols - SIDE / 2)


def _fundus_array(serial: int) -> np.ndarray:
    """RGB whose red plane tells the serial, disc radius 8, cup radius 4 (inside the disc)."""
    array = np.zeros((SIDE, SIDE, 5), dtype=np.float64)
    array[..., 0] = serial
    array[..., 1] = np.arange(SIDE)[None, :] * 10
    array[..., 2] = 255
    array[..., 3] = _radius() < 8
    array[..., 4] = _radius() < 4
    return array


def _fundus_tree(root: Path) -> Path:
    serial = 0
    for site, count in FUNDUS_FILES.items():
        folder = root / site / "data_npy"
        folder.mkdir(parents=True)
        for i in range(count):
            np.save(folder / f"sample{i}.npy", _fundus_array(serial))
            serial += 1
    return root


def _prostate_tree(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for site in PROSTATE.domains:
        folder = root / site
        folder.mkdir(parents=True)
        for i in range(PROSTATE_FILES):
            array = np.zeros((SIDE, SIDE, 2), dtype=np.float32)
            array[..., 0] = rng.normal(300.0, 50.0, (SIDE, SIDE))  # MR intensities, no scale
            array[..., 1] = _radius() < 6
            np.save(folder / f"Case00_slice{i}.npy", array)
    return root


def test_nested_channels_exact_dice_and_single_channel_unchanged():
    mask = torch.tensor([[[1, 2], [0, 0]], [[1, 1], [0, 0]]], dtype=torch.uint8)
    split = Split(x=torch.zeros(2, 3, 2, 2, dtype=torch.uint8), y=torch.zeros(2).long(), mask=mask)
    # channel 0 (disc) predicted on the top row of both images, channel 1 (cup) nowhere but
    # pixel (0, 0) of image 0: disc Dice 1 and 1; cup Dice 0 (image 0) and 1 (both empty)
    logits = torch.full((2, 2, 2, 2), -5.0)
    logits[:, 0, 0, :] = 5.0
    logits[0, 1, 0, 0] = 5.0
    per_channel = dice_per_channel(IgnoredModel(), split, torch.device("cpu"), lambda m, x: logits)
    assert per_channel == [1.0, 0.5]
    assert dice(IgnoredModel(), split, torch.device("cpu"), lambda m, x: logits) == 0.75
    single = torch.tensor([[[[0.0, 1.0], [1.0, 0.0]]]])
    assert torch.equal(channel_targets(single, 1), single)  # {0, 1} masks: the mask itself
    probs = torch.tensor([[[[0.2, 0.9], [0.6, 0.1]]]])
    assert torch.equal(
        segmentation_loss(torch.logit(probs), single),
        soft_dice_loss(torch.sigmoid(torch.logit(probs)), single),
    )


class IgnoredModel(torch.nn.Module):
    """A stand-in for the model: the tests' predict functions return fixed logits."""


def test_catalog_lists_both_sets_with_their_layout(capsys):
    assert CATALOG["fundus"].domains == FUNDUS.domains
    assert CATALOG["prostate"].domains == ("BIDMC", "HK", "I2CVB", "ISBI", "ISBI_1.5", "UCL")
    assert CATALOG["fundus"].official_totals == {
        "client1": 101,
        "client2": 159,
        "client3": 400,
        "client4": 400,
    }
    assert main(["datasets", "list"]) == 0
    out = capsys.readouterr().out
    assert "fundus  [384 px]" in out and "prostate  [384 px]" in out
    assert (
        "fedshift run -d fundus -t client1 --set problem=segmentation --model unet "
        "--set data_root=PATH"
    ) in out


def test_check_counts_splits_and_official_count_warnings(tmp_path, capsys):
    root = _fundus_tree(tmp_path / "fundus")
    (root / "client1" / "data_npy" / "._sample0.npy").write_bytes(b"macOS metadata")  # ignored
    counts, warnings = check_dataset("fundus", root)
    assert counts["client1"] == {"train": 2, "val": 1, "test": 3}
    assert counts["client4"] == {"train": 5, "val": 1, "test": 6}
    assert len(warnings) == 4 and "fundus/client3: 5 images, the official copy has 400" in warnings
    assert main(["datasets", "check", "fundus", "--root", str(root)]) == 0
    captured = capsys.readouterr()
    assert "client2: train 3, val 1, test 4" in captured.out
    assert "the official copy has 159" in captured.err
    counts, warnings = check_dataset("prostate", _prostate_tree(tmp_path / "prostate"))
    assert counts["ISBI_1.5"] == {"train": 3, "val": 1, "test": 4} and warnings == []


def test_fundus_loads_nested_label_maps_and_a_seeded_split(tmp_path):
    root = _fundus_tree(tmp_path / "fundus")
    ds = load_dataset("fundus", data_root=root, image_size=SIDE, seed=0)
    assert ds.channels == 3 and ds.image_size == SIDE and ds.classes == ["disc", "cup"]
    assert ds.meta["mask_channels"] == ["disc", "cup"] and ds.meta["problem"] == "segmentation"
    assert ds.meta["counts"]["client3"] == {"train": 4, "val": 1, "test": 5}
    site = ds.domain("client3")
    expected = (_radius() < 8).astype(np.uint8) + (_radius() < 4)
    assert torch.equal(site.test.mask, torch.from_numpy(expected).expand(5, SIDE, SIDE))
    assert set(torch.unique(site.test.mask).tolist()) == {0, 1, 2}
    assert torch.equal(site.test.x[:, 1, 0], torch.arange(SIDE).mul(10).expand(5, SIDE).byte())
    serials = sorted(site.train.x[:, 0, 0, 0].tolist() + site.val.x[:, 0, 0, 0].tolist())
    assert serials == sorted(site.test.x[:, 0, 0, 0].tolist()) == list(range(7, 12))
    targets = channel_targets(site.test.mask[:, None].float(), 2)
    assert torch.equal(targets[:, 0].bool(), site.test.mask > 0)  # disc = labels {1, 2}
    assert torch.equal(targets[:, 1].bool(), site.test.mask == 2)  # cup = label {2}
    logits = (targets - 0.5) * 1e3
    assert float(segmentation_loss(logits, site.test.mask[:, None].float())) < 1e-6
    again = load_dataset("fundus", data_root=root, image_size=SIDE, seed=0)  # from the cache
    assert ds.meta["image_cache"]["client3"].endswith(".npy")
    assert torch.equal(again.domain("client3").val.x, site.val.x)
    other = [load_dataset("fundus", data_root=root, image_size=SIDE, seed=s) for s in (1, 2, 3)]
    vals = {tuple(d.domain("client4").val.x[:, 0, 0, 0].tolist()) for d in other}
    assert len(vals) > 1  # split_seed moves the holdout


def test_resize_keeps_masks_nearest_and_prostate_is_min_max_scaled(tmp_path):
    ds = load_dataset("fundus", data_root=_fundus_tree(tmp_path / "f"), image_size=8)
    assert tuple(ds.domain("client1").test.x.shape) == (3, 3, 8, 8)
    assert set(torch.unique(ds.domain("client1").test.mask).tolist()) <= {0, 1, 2}
    prostate = load_dataset("prostate", data_root=_prostate_tree(tmp_path / "p"), image_size=16)
    assert prostate.channels == 1 and prostate.meta["mask_channels"] == ["prostate"]
    x = prostate.domain("HK").test.x
    assert tuple(x.shape) == (4, 1, 16, 16)
    assert x.flatten(1).amin(1).tolist() == [0] * 4
    mask = prostate.domain("HK").test.mask
    assert set(torch.unique(mask).tolist()) == {0, 1}


def test_cup_outside_the_disc_counts_as_disc_with_a_warning_and_sites_can_be_chosen(tmp_path):
    root = _fundus_tree(tmp_path / "fundus")
    odd = _fundus_array(0)
    odd[0, 0, 4] = 1  # a cup pixel in the corner, outside the disc
    np.save(root / "client2" / "data_npy" / "sample1.npy", odd)
    with pytest.warns(RuntimeWarning, match="1 cup pixels lie outside the disc mask"):
        ds = load_dataset("fundus:client1,client2", data_root=root, image_size=SIDE)
    assert ds.domain_names == ["client1", "client2"]
    assert ds.meta["mask_channels"] == ["disc", "cup"]
    masks = ds.domain("client2").test.mask
    assert sorted(masks[:, 0, 0].tolist()) == [0, 0, 0, 2]


def _expect_one_line(name: str, root: Path, match: str, capsys, *, load: bool = False) -> None:
    with pytest.raises(DatasetError, match=match) as info:
        if load:
            load_dataset(name, data_root=root, image_size=8)
        else:
            check_dataset(name, root)
    assert "\n" not in str(info.value)
    argv = ["datasets", "check", name, "--root", str(root)]
    if load:
        argv = ["run", "-a", "fedavg", "-d", name, "--model", "unet", "--rounds", "1"]
        argv += ["--set", "problem=segmentation", "--set", f"data_root={root}"]
        argv += ["--set", "threads=1", "--set", "image_size=8", "--quiet"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    err = [line for line in err if not line.startswith("fedshift: decoding")]  # progress
    assert len(err) == 1 and err[0].startswith("fedshift: error:")


def test_each_bad_copy_is_a_one_line_error(tmp_path, capsys):
    _expect_one_line("fundus", tmp_path / "nowhere", "does not exist", capsys)
    root = _fundus_tree(tmp_path / "fundus")
    sample = root / "client2" / "data_npy" / "sample0.npy"
    (root / "client4" / "data_npy").rename(root / "client4" / "npy")
    _expect_one_line("fundus", root, "missing site folder .*client4", capsys)
    (root / "client4" / "npy").rename(root / "client4" / "data_npy")
    for extra in (root / "client4" / "data_npy").iterdir():
        extra.rename(root / "client4" / extra.name)
    _expect_one_line("fundus", root, "has no .npy file", capsys)
    for moved in (root / "client4").glob("*.npy"):
        moved.rename(root / "client4" / "data_npy" / moved.name)
    sample.write_bytes(b"not an array")
    _expect_one_line("fundus", root, "cannot read .*sample0.npy as a .npy array", capsys)
    np.save(sample, np.zeros((SIDE, SIDE, 4)))
    _expect_one_line("fundus", root, r"shape \(24, 24, 4\); expected .*H×W×5", capsys)
    np.save(sample, np.array([{"pickled": 1}], dtype=object))
    _expect_one_line("fundus", root, "cannot read .*sample0.npy", capsys)
    bad = _fundus_array(0)
    bad[0, 0, 3] = 255
    np.save(sample, bad)
    _expect_one_line(
        "fundus", root, r"mask values \[0.0, 1.0, 255.0\], expected 0 and 1", capsys, load=True
    )
    bad = _fundus_array(0)
    bad[0, 0, 0] = 300
    np.save(sample, bad)
    _expect_one_line(
        "fundus", root, r"image values span \[0, 300\], expected 0..255", capsys, load=True
    )
    prostate = _prostate_tree(tmp_path / "prostate")
    (prostate / "UCL" / "Case00_slice0.npy").rename(prostate / "UCL" / "x.txt")
    for other in (prostate / "UCL").glob("*.npy"):
        other.unlink()
    _expect_one_line("prostate", prostate, "site folder .*UCL has no .npy file", capsys)


def _run_argv(name: str, target: str, root: Path, out: Path, *, segmentation: bool = True):
    argv = ["run", "-a", "feddg-elcfs", "-d", name, "-t", target, "--rounds", "1", "--quiet"]
    argv += ["--out", str(out)]
    settings = [f"data_root={root}", "threads=1", "image_size=16", "batch_size=4"]
    if segmentation:
        argv += ["--model", "unet"]
        settings.append("problem=segmentation")
    for setting in settings:
        argv += ["--set", setting]
    return argv


@pytest.mark.parametrize(("name", "target"), [("fundus", "client1"), ("prostate", "UCL")])
def test_one_round_cli_run_reports_dice(name, target, tmp_path, capsys):
    root = (_fundus_tree if name == "fundus" else _prostate_tree)(tmp_path / "data")
    out = tmp_path / "run"
    assert main(_run_argv(name, target, root, out)) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 <= summary["target_dice"] <= 1.0
    assert set(summary["per_domain_dice"]) == set(CATALOG[name].domains)
    if name == "fundus":
        channels = summary["target_channel_dice"]
        assert set(channels) == {"disc", "cup"}
        assert summary["target_dice"] == pytest.approx((channels["disc"] + channels["cup"]) / 2)
        assert set(summary["per_domain_channel_dice"]["client2"]) == {"disc", "cup"}
    else:
        assert "target_channel_dice" not in summary
    meta = json.loads((out / "config.json").read_text())["run_info"]["dataset_meta"]
    assert meta["counts"][target]["test"] == (FUNDUS_FILES["client1"] if name == "fundus" else 4)
    capsys.readouterr()
    assert main(_run_argv(name, target, root, tmp_path / "r2", segmentation=False)) == 2
    assert "run it with --set problem=segmentation" in capsys.readouterr().err
