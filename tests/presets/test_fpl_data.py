"""FPL's presets hold the official code's data: per client ``int(percent x the domain's train
set)`` images, disjoint, tested on the domain's held-out or official test images.

``fpl-digits``: 1 % of each official train file (MNIST 600, USPS 72, SVHN 732, SYN 250) and
the whole official test files (``catalog_split=full``: no KD3A/FACT 25,000 / 9,000 cap).
``fpl-office-caltech10``: FPL's own test rule (image ``i`` in ImageFolder order when
``i % 10 > 7``) and 20 % of the other images per client.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import test_catalog_digit_five as d5_files
import torch
from PIL import Image

from fedshift.config import resolve
from fedshift.core.split import RowGather, Split
from fedshift.data.catalog import digit_five as d5
from fedshift.data.domains import Domain, DomainDataset
from fedshift.engine.assembly import load_config_dataset
from fedshift.scenarios import build_scenario

FPL_DIGITS = {"mnist": 3, "usps": 7, "svhn": 6, "syn": 4}
#: the official files (train, test) of the FPL domains of the public copies
OFFICIAL_FILES = {d: (d5.OFFICIAL[d]["train"], d5.OFFICIAL[d]["test"]) for d in FPL_DIGITS}
#: the generated copy's files (train, test): 1 % of each train file is 7..12 images
TINY_FILES = {"mnist": (1000, 300), "usps": (700, 120), "svhn": (1200, 250), "syn": (800, 90)}


@pytest.fixture(autouse=True)
def image_cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "fedshift-cache"))
    return tmp_path / "fedshift-cache"


def _digits_tree(root: Path) -> Path:
    """MNIST, USPS, SVHN, SynDigits in the public copies' formats with TINY_FILES images."""
    files = {d: (d5_files._labels(n), d5_files._labels(m, 3)) for d, (n, m) in TINY_FILES.items()}
    mnist = root / "mnist"
    d5_files._write_idx(
        mnist / "train-images-idx3-ubyte|train-labels-idx1-ubyte", files["mnist"][0]
    )
    d5_files._write_idx(mnist / "t10k-images-idx3-ubyte|t10k-labels-idx1-ubyte", files["mnist"][1])
    d5_files._write_usps(root / "usps" / "usps.bz2", files["usps"][0])
    d5_files._write_usps(root / "usps" / "usps.t.bz2", files["usps"][1])
    for split, labels in zip(("train", "test"), files["svhn"], strict=True):
        d5_files._write_svhn_style(root / "svhn" / f"{split}_32x32.mat", labels, True)
    for split, labels in zip(("train", "test"), files["syn"], strict=True):
        d5_files._write_svhn_style(root / "syn" / f"synth_{split}_32x32.mat", labels, False)
    return root


def _fpl_digits(root: Path, *sets: str):
    return resolve(None, {"preset": "fpl-digits"}, [f"data_root={root}", *sets])


def _rows(split: Split) -> list[int]:
    assert isinstance(split.x, RowGather) and len(split.x.sources) == 1
    return split.x.rows.tolist()


def _per_client(task) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for client in task.clients:
        out.setdefault(client.domain, []).append(len(client.train))
    return out


def _disjoint(task) -> None:
    for domain in {c.domain for c in task.clients}:
        rows = [r for c in task.clients if c.domain == domain for r in _rows(c.train)]
        assert len(rows) == len(set(rows)), f"{domain}: a training image held by two clients"


def test_fpl_digits_preset_settings(tmp_path):
    cfg = _fpl_digits(_digits_tree(tmp_path / "d5"))
    assert cfg.catalog_split == "full"
    assert (cfg.client_data_of, cfg.client_data_fraction) == ("domain", 0.01)
    assert cfg.clients_per_domain == "mnist:3,usps:7,svhn:6,syn:4"


def test_fpl_digits_clients_hold_one_percent_of_the_official_train_files(tmp_path):
    """The official files' sizes, as the digit-five entry loads them with catalog_split=full
    (train + val: the whole train file; test: the whole test file): MNIST 600, USPS 72,
    SVHN 732, SYN 250 per client, no image twice, every test image of the test files."""
    cfg = _fpl_digits(_digits_tree(tmp_path / "d5"))
    domains = {}
    for name, (train, test) in OFFICIAL_FILES.items():
        val = round(0.2 * train)

        def split(n: int, offset: int = 0) -> Split:
            labels = torch.from_numpy(d5_files._labels(n, offset))
            return Split(x=torch.zeros((n, 3, 1, 1), dtype=torch.uint8), y=labels)

        domains[name] = Domain(name, split(train - val), split(val), split(test, 3))
    official = DomainDataset("digit-five", domains, [str(d) for d in range(10)], 3, 1)
    task = build_scenario(cfg, official, pooled=False)
    expected = {"mnist": 600, "usps": 72, "svhn": 732, "syn": 250}
    assert _per_client(task) == {d: [expected[d]] * k for d, k in FPL_DIGITS.items()}
    _disjoint(task)
    assert task.targets == list(FPL_DIGITS)
    for name, (_, test) in OFFICIAL_FILES.items():
        assert len(official.domain(name).test) == test  # 10,000, 2,007, 26,032, 9,000


def test_fpl_digits_on_a_copy_reads_whole_files_without_the_kd3a_caps(tmp_path, monkeypatch):
    """On a generated copy, with the KD3A/FACT caps shrunk below its files: the preset still
    reads every train and test image (catalog_split=full) and gives each client int(1 %) of
    its train file; the default split (KD3A/FACT's presets) keeps sampling them down."""
    monkeypatch.setattr(d5, "TRAIN_CAP", 500)
    monkeypatch.setattr(d5, "TEST_CAP", 100)
    root = _digits_tree(tmp_path / "d5")
    cfg = _fpl_digits(root, "image_size=8")
    data = load_config_dataset(cfg, str(tmp_path / "cache"))
    for name, (train, test) in TINY_FILES.items():
        domain = data.domain(name)
        assert len(domain.train) + len(domain.val) == train
        assert len(domain.test) == test
    task = build_scenario(cfg, data, pooled=False)
    wanted = {d: [int(0.01 * TINY_FILES[d][0])] * k for d, k in FPL_DIGITS.items()}
    assert _per_client(task) == wanted  # MNIST 10, USPS 7, SVHN 12, SYN 8
    _disjoint(task)
    capped = load_config_dataset(_fpl_digits(root, "image_size=8", "catalog_split=default"))
    for name, (train, test) in TINY_FILES.items():
        domain = capped.domain(name)
        assert len(domain.train) + len(domain.val) == min(train, 500)
        assert len(domain.test) == min(test, 100)


#: Office-Caltech10's official images per domain; FPL's rule holds out i % 10 > 7 of them
OFFICE_CALTECH10 = {"amazon": 958, "caltech": 1123, "dslr": 157, "webcam": 295}


def _office_caltech10(root: Path) -> None:
    """Each domain with its official count over 10 classes (PNG, colour = serial)."""
    serial = 0
    for domain, total in OFFICE_CALTECH10.items():
        for i in range(total):
            path = root / domain / f"class_{i % 10}" / f"frame_{i:04d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (4, 4), (serial % 256, serial // 256, 7)).save(path)
            serial += 1


def test_fpl_office_caltech10_holds_out_the_official_test_images(tmp_path):
    """The official counts: test 190 / 224 / 30 / 58 images (i % 10 > 7), disjoint from
    every client; each client int(20 %) of the other images: 153, 179, 25, 47."""
    root = tmp_path / "oc10"
    _office_caltech10(root)
    sets = [f"data_root={root}", "image_size=4"]
    cfg = resolve(None, {"preset": "fpl-office-caltech10"}, sets)
    data = load_config_dataset(cfg, str(tmp_path / "cache"))
    task = build_scenario(cfg, data, pooled=False)
    tests = {d: len(data.domain(d).test) for d in OFFICE_CALTECH10}
    assert tests == {d: sum(i % 10 > 7 for i in range(n)) for d, n in OFFICE_CALTECH10.items()}
    assert tests == {"amazon": 190, "caltech": 224, "dslr": 30, "webcam": 58}
    clients = {"caltech": 3, "amazon": 2, "webcam": 1, "dslr": 4}
    each = {d: int(0.2 * (n - tests[d])) for d, n in OFFICE_CALTECH10.items()}
    assert each == {"amazon": 153, "caltech": 179, "dslr": 25, "webcam": 47}
    assert _per_client(task) == {d: [each[d]] * clients[d] for d in _per_client(task)}
    for domain in OFFICE_CALTECH10:
        test = set(_rows(data.domain(domain).test))
        trained = {r for c in task.clients if c.domain == domain for r in _rows(c.train)}
        assert not test & trained
    # which images: sorted classes, then sorted files (ImageFolder), i % 10 > 7
    first = data.domain("dslr").test.x[:, 0, 0, 0].long()
    files = sorted((p.parent.name, p.name) for p in (root / "dslr").rglob("*.png"))
    serials = {f: 958 + 1123 + int(f[1][6:10]) for f in files}  # dslr's serials
    expected = [serials[f] % 256 for i, f in enumerate(files) if i % 10 > 7]
    assert sorted(first.tolist()) == sorted(expected) and len(expected) == 30
