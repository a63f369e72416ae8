"""No test image is a training image: every catalog dataset, read from a tiny copy in its
authors' exact layout, under every protocol, as a run loads and splits it.

An image is known by where it is stored, not by its pixels: every split is a tensor, a view
of one or a :class:`~fedshift.core.split.RowGather` of rows of the arrays a loader decodes
each file (or each row of an official file) into once, so two samples are the same image
exactly when they are the same row of the same stored array.

Under ``per-domain`` and ``personalized`` every scored domain also trains: no image of a
scored test split (a domain's, or a client's own share) may be any client's training or
validation image. Under ``lodo`` and ``msst`` no labeled (source) client's image may be a
scored one; the msst target is scored on its whole domain, the unlabeled data it adapts to
(the UDA papers' transductive protocol: its labels never reach training).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import test_camelyon17
import test_catalog_segmentation_sets as segmentation
import torch
from PIL import Image
from test_catalog_cifar import _cifar10, _cifar100
from test_catalog_digit_five import _tree as _digit_five_tree
from test_catalog_loaders import _domainnet_tree

from fedshift.config import resolve
from fedshift.core.split import RowGather, Split
from fedshift.data.catalog import CATALOG, FOLDER_DATASETS
from fedshift.engine.assembly import load_config_dataset
from fedshift.scenarios import PROTOCOLS, build_scenario

#: images per class of the generated class-folder and PACS copies: 30 per domain, so a
#: held-out 20 % is 6 images
PER_CLASS = 10
FOLDER_CLASSES = ("bird", "Alarm_Clock", "car")


def _jpeg(path: Path, serial: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    colour = (serial % 256, serial // 256 % 256, 90)
    Image.new("RGB", (8, 8), colour).save(path, format="JPEG", quality=100)


def _folders(name: str, root: Path) -> None:
    serial = 0
    for domain in CATALOG[name].domains:
        base = root / domain / "images" if name == "office31" else root / domain
        for cls in FOLDER_CLASSES:
            for i in range(PER_CLASS):
                _jpeg(base / cls / f"{domain}_{i:03d}.jpg", serial)
                serial += 1


def _pacs(root: Path) -> None:
    """The kfold lists (1-based labels): crossval every 4th image, test_kfold all of them."""
    serial = 0
    for domain in CATALOG["pacs"].domains:
        rows = []
        for label, cls in ((1, "dog"), (3, "giraffe"), (7, "person")):
            for i in range(PER_CLASS):
                relative = f"{domain}/{cls}/pic_{i:03d}.jpg"
                _jpeg(root / "kfold" / relative, serial)
                serial += 1
                rows.append(f"{relative} {label}")
        lists = {
            "train": [r for k, r in enumerate(rows) if k % 4],
            "crossval": [r for k, r in enumerate(rows) if not k % 4],
            "test": rows,
        }
        for split, lines in lists.items():
            (root / f"{domain}_{split}_kfold.txt").write_text("\n".join(lines) + "\n")


def _camelyon17(root: Path, monkeypatch) -> None:
    monkeypatch.setattr(test_camelyon17, "PER_CENTER", 12)
    test_camelyon17._tree(root)


def _fundus(root: Path, monkeypatch) -> None:
    monkeypatch.setattr(segmentation, "FUNDUS_FILES", dict.fromkeys(segmentation.FUNDUS_FILES, 12))
    segmentation._fundus_tree(root)


def _prostate(root: Path, monkeypatch) -> None:
    monkeypatch.setattr(segmentation, "PROSTATE_FILES", 12)
    segmentation._prostate_tree(root)


def _femnist(root: Path) -> None:
    """LEAF's layout: 3 writers, 12 train and 4 test samples each over 3 classes."""
    for part, count in (("train", 12), ("test", 4)):
        (root / part).mkdir(parents=True)
        writers = [f"f000{k}_0{k}" for k in range(1, 4)]
        data = {
            w: {
                "x": [[(k * 50 + i) / 255.0] * 784 for i in range(count)],
                "y": [i % 3 for i in range(count)],
            }
            for k, w in enumerate(writers)
        }
        content = {"users": writers, "num_samples": [count] * 3, "user_data": data}
        (root / part / f"all_data_0_niid_0_keep_0_{part}_9.json").write_text(json.dumps(content))


#: catalog name -> a builder of its tiny copy (root, monkeypatch)
BUILDERS = {
    **{name: (lambda root, _, name=name: _folders(name, root)) for name in FOLDER_DATASETS},
    "pacs": lambda root, _: _pacs(root),
    "domainnet": lambda root, _: _domainnet_tree(root),
    "domainnet10": lambda root, _: _domainnet_tree(root),
    "cifar10": lambda root, _: _cifar10(root),
    "cifar100": lambda root, _: _cifar100(root, True),
    "digit-five": lambda root, _: _digit_five_tree(root),
    "fundus": _fundus,
    "prostate": _prostate,
    "camelyon17": _camelyon17,
    "femnist": lambda root, _: _femnist(root),
}


def test_every_catalog_dataset_has_a_builder():
    assert set(BUILDERS) == set(CATALOG)


def stored_rows(split: Split) -> set[tuple[int, int]]:
    """Each sample of ``split`` as (the stored array's memory, its row's element offset)."""
    images = split.x
    if isinstance(images, RowGather):
        tensors = images.sources
        which = images.source if images.source is not None else torch.zeros_like(images.rows)
        pairs = zip(which.tolist(), images.rows.tolist(), strict=True)
    else:
        tensors = (images,)
        pairs = ((0, row) for row in range(len(images)))
    out = set()
    for k, row in pairs:
        tensor = tensors[k]
        address = tensor.untyped_storage().data_ptr()
        out.add((address, tensor.storage_offset() + row * tensor.stride(0)))
    assert len(out) == len(split), "a split names one stored image twice"
    return out


def load_task(name: str, protocol: str, root: Path, cache: Path):
    dataset = CATALOG[name]
    flags = {"dataset": name, "protocol": protocol}
    if PROTOCOLS[protocol].default_target is None:  # lodo, msst: the first domain held out
        flags["target"] = dataset.domains[0] if dataset.domains else "f0001_01"  # a writer
    sets = [f"data_root={root}", "image_size=8"]
    cfg = resolve(None, flags, sets)
    data = load_config_dataset(cfg, str(cache))
    return data, build_scenario(cfg, data, pooled=False)


def leaks(name: str, protocol: str, root: Path, cache: Path) -> dict[str, float]:
    """Scored test split (domain, or client share) -> the share of its images that a client
    trains on (or validates with, where the domain trains with labels)."""
    data, task = load_task(name, protocol, root, cache)
    labeled = [c for c in task.clients if c.role == "source"]
    seen = set()
    for client in labeled:
        seen |= stored_rows(client.train) | stored_rows(client.val)
    scored = {f"domain {d}": data.domain(d).test for d in task.targets}
    if task.per_client:
        scored |= {f"client {c.name}": c.test for c in task.clients}
    for where, split in scored.items():
        assert len(split), f"{name}/{protocol}: {where} has no test image"
    return {where: len(stored_rows(split) & seen) / len(split) for where, split in scored.items()}


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    """Catalog name -> its generated copy, built once for all protocols."""
    made: dict[str, Path] = {}
    patch = pytest.MonkeyPatch()

    def copy(name: str) -> Path:
        if name not in made:
            root = tmp_path_factory.mktemp(name)
            BUILDERS[name](root, patch)
            patch.undo()
            made[name] = root
        return made[name]

    yield copy
    patch.undo()


RUNS = [
    (name, protocol)
    for name in CATALOG
    for protocol in PROTOCOLS
    if not (protocol in ("lodo", "msst") and name in ("cifar10", "cifar100"))  # one domain
]


@pytest.mark.parametrize("name, protocol", RUNS)
def test_no_scored_test_image_is_a_training_image(name, protocol, copies, tmp_path):
    found = leaks(name, protocol, copies(name), tmp_path / "cache")
    leaked = {where: f"{share:.0%}" for where, share in found.items() if share}
    assert not leaked, f"{name} under {protocol}: test images that clients train on: {leaked}"


def test_a_held_out_target_is_scored_on_its_whole_domain(copies, tmp_path):
    """lodo's unseen target keeps every image of its domain as test."""
    root = copies("office-caltech10")
    data, task = load_task("office-caltech10", "lodo", root, tmp_path / "cache")
    target = data.domain(task.targets[0])
    assert len(target.test) == len(FOLDER_CLASSES) * PER_CLASS
    assert stored_rows(target.train) | stored_rows(target.val) <= stored_rows(target.test)
    assert np.isclose(len(target.train) + len(target.val), len(target.test))
