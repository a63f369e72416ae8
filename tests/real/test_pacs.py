"""The ``real`` tier on PACS: fedshift against the authors' own files.

Runs when ``$FEDSHIFT_REAL_DATA`` names a folder holding ``PACS/`` (the official kfold layout
and lists; ``.ci/run`` points it at ``../shared/datasets``), and is skipped with the reason
otherwise. Every image is decoded once, at 32 px, into a cache shared by the module's tests.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from fedshift.cli import main
from fedshift.data import load_dataset

pytestmark = pytest.mark.real

#: the official copy's images per domain and split (train_kfold, crossval_kfold, test_kfold)
OFFICIAL = {
    "art_painting": (1840, 208, 2048),
    "cartoon": (2107, 237, 2344),
    "photo": (1499, 171, 1670),
    "sketch": (3531, 398, 3929),
}
#: the authors' class order: label k of a list line is CLASSES[k - 1]
CLASSES = ["dog", "elephant", "giraffe", "guitar", "horse", "house", "person"]
SIZE = 32


@pytest.fixture(scope="module")
def real_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("real-cache")


@pytest.fixture(scope="module")
def pacs(pacs_root, real_cache):
    return load_dataset("pacs", data_root=pacs_root, image_size=SIZE, cache_dir=real_cache)


def official_list(root: Path, domain: str, split: str) -> list[tuple[str, int]]:
    """(relative image path, 0-based label) per line of one official list, read here directly."""
    lines = (root / f"{domain}_{split}_kfold.txt").read_text().split("\n")
    entries = []
    for line in lines:
        if line.strip():
            name, label = line.split()
            entries.append((name, int(label) - 1))
    return entries


def pil_decode(path: Path, size: int) -> np.ndarray:
    """What the run's resolution means, spelled out with PIL: a draft decode of the file,
    RGB, bilinear resize to ``size``², channels first."""
    from PIL import Image

    with Image.open(path) as im:
        im.draft("RGB", (size, size))
        rgb = im.convert("RGB")
        if rgb.size != (size, size):
            rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
        return np.asarray(rgb, dtype=np.uint8).transpose(2, 0, 1)


def test_datasets_check_prints_the_official_counts(pacs_root, capsys):
    assert main(["datasets", "check", "pacs", "--root", str(pacs_root)]) == 0
    out = capsys.readouterr().out
    for domain, (train, val, test) in OFFICIAL.items():
        assert f"{domain}: train {train}, val {val}, test {test}" in out, out


def test_labels_follow_the_official_class_order(pacs_root, pacs):
    assert pacs.classes == CLASSES
    for domain, (train, val, test) in OFFICIAL.items():
        d = pacs.domain(domain)
        assert (len(d.train), len(d.val), len(d.test)) == (train, val, test)
        for split, attr in (("train", "train"), ("crossval", "val")):
            entries = official_list(pacs_root, domain, split)
            assert d.split(attr).y.tolist() == [label for _, label in entries]
            # the label of every line names the class folder its image lies in
            assert all(name.split("/")[1] == CLASSES[label] for name, label in entries)
        assert sorted(d.test.y.tolist()) == sorted(
            label for _, label in official_list(pacs_root, domain, "test")
        )


def test_every_image_decodes_and_the_cache_equals_a_direct_pil_decode(pacs_root, pacs, real_cache):
    """The cached rows (decoded from the real JPEG/PNG files) equal PIL's own decode at the
    run's resolution: every row of a seeded sample of 100 per domain, and a second load maps
    the same bytes."""
    again = load_dataset("pacs", data_root=pacs_root, image_size=SIZE, cache_dir=real_cache)
    pick = random.Random(0)
    for domain in OFFICIAL:
        d = pacs.domain(domain)
        entries = official_list(pacs_root, domain, "train") + official_list(
            pacs_root, domain, "crossval"
        )
        assert len(entries) == len(d.test)  # train and crossval make up test_kfold
        pixels = d.test.x[:]
        assert pixels.shape == (len(entries), 3, SIZE, SIZE)
        assert np.array_equal(np.asarray(pixels), np.asarray(again.domain(domain).test.x[:]))
        for i in pick.sample(range(len(entries)), 100):
            expected = pil_decode(pacs_root / "kfold" / entries[i][0], SIZE)
            assert np.array_equal(np.asarray(pixels[i]), expected), (domain, entries[i][0])
        assert pixels.float().std() > 10  # real pictures, not a constant fill


# A one-round FedAvg on PACS through the CLI: the drift prefix of experiments/pacs-cpu-scratch
# (tests/experiments) runs it and compares every number bit for bit.
