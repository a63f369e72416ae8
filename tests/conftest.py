"""Shared fixtures: the digits-dg dataset built once per session into a temp cache, smaller
cuts of it, a synthetic personalized task and a backbone pretrained on digits. Plain helper
functions live in ``helpers.py``. Also puts every test folder on ``sys.path`` (tests/README.md)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import torch
from helpers import CLASSES

from fedshift.core.context import TrainConfig
from fedshift.data.domains import Domain, DomainDataset, Split
from fedshift.data.registry import resized
from fedshift.pretrain import pretrain

# pytest's default ``prepend`` import mode puts only a test file's own folder (and this one) on
# sys.path; every test folder is added here, after the installed packages, so a test imports
# helpers.py, two_clients.py or another test file's data builders by basename from any folder.
# Basenames are unique across tests/ (prepend mode refuses two test files of one name anyway).
for _folder in sorted(Path(__file__).resolve().parent.rglob("*")):
    if _folder.is_dir() and not _folder.name.startswith((".", "_")):
        if str(_folder) not in sys.path:
            sys.path.append(str(_folder))


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory):
    """Every test's default cache (``$FEDSHIFT_CACHE``) is a temp folder, never the user's
    ``~/.cache/fedshift`` (tests that need the built digits-dg set it to ``digits_cache``)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("FEDSHIFT_CACHE", str(tmp_path_factory.mktemp("default-cache")))
    yield
    patch.undo()


@pytest.fixture(scope="session")
def digits_cache(tmp_path_factory) -> str:
    """A temp cache. ``$FEDSHIFT_TEST_CACHE`` may name a folder holding a built digits-dg
    cache to copy in instead of rebuilding (it is checked against its sha256 like any cache)."""
    path = tmp_path_factory.mktemp("fedshift-cache")
    seed = os.environ.get("FEDSHIFT_TEST_CACHE")
    if seed:
        for built in Path(seed).glob("digits-dg-*"):
            shutil.copy(built, path)
    return str(path)


@pytest.fixture(scope="session")
def digits(digits_cache) -> DomainDataset:
    from fedshift.data import load_dataset

    return load_dataset("digits-dg", cache_dir=digits_cache)


@pytest.fixture
def in_tmp(tmp_path, monkeypatch, digits_cache, digits):
    """A temp working folder, with the built digits-dg cache as ``$FEDSHIFT_CACHE`` (CLI runs)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDSHIFT_CACHE", digits_cache)
    return tmp_path


def shrink(dataset: DomainDataset, train: int, val: int, test: int) -> DomainDataset:
    """The first samples of each split of each domain (a fast but real task)."""

    def cut(split, n):
        return split.subset(torch.arange(min(n, len(split))))

    domains = {
        name: Domain(
            name=name, train=cut(d.train, train), val=cut(d.val, val), test=cut(d.test, test)
        )
        for name, d in dataset.domains.items()
    }
    return DomainDataset(
        name=dataset.name,
        domains=domains,
        classes=dataset.classes,
        channels=dataset.channels,
        image_size=dataset.image_size,
        meta=dict(dataset.meta),
    )


@pytest.fixture(scope="session")
def tiny_digits(digits) -> DomainDataset:
    return shrink(digits, train=96, val=32, test=32)


@pytest.fixture(scope="session")
def micro_digits(digits) -> DomainDataset:
    return shrink(digits, train=48, val=16, test=16)


@pytest.fixture(scope="session")
def nano_digits(digits) -> DomainDataset:
    """32 train images a domain, one batch per client: for checks that need a real training
    loop but as few steps as possible (bf16 on a CPU without native bf16 is ~9x fp32)."""
    return shrink(digits, train=32, val=16, test=16)


#: the side, in pixels, of the images of checks that run every algorithm (the contract, bf16,
#: checkpoints, attacks, resumes, training keys): they check behaviour, not accuracy, and a
#: convolution at 16 px costs a quarter of 32 px's (the contract's runs ~3x cheaper)
BEHAVIOUR_PX = 16


@pytest.fixture(scope="session")
def tiny16_digits(tiny_digits) -> DomainDataset:
    """``tiny_digits`` resized to ``BEHAVIOUR_PX``."""
    return resized(tiny_digits, BEHAVIOUR_PX)


@pytest.fixture(scope="session")
def nano16_digits(nano_digits) -> DomainDataset:
    """``nano_digits`` resized to ``BEHAVIOUR_PX``."""
    return resized(nano_digits, BEHAVIOUR_PX)


def _split(per_class: int, seed: int) -> Split:
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(CLASSES).repeat_interleave(per_class)
    base = (y.view(-1, 1, 1, 1).float() * 60).expand(-1, 3, 8, 8)
    noise = torch.randint(0, 40, base.shape, generator=gen).float()
    return Split(x=(base + noise).clamp(0, 255).to(torch.uint8), y=y)


@pytest.fixture(scope="session")
def synthetic() -> DomainDataset:
    """One domain of 3×8×8 images in ``CLASSES`` classes easily told apart (a personalized
    task)."""
    return DomainDataset(
        name="synth",
        domains={"a": Domain("a", _split(24, 0), _split(4, 1), _split(6, 2))},
        classes=[str(c) for c in range(CLASSES)],
        channels=3,
        image_size=8,
    )


@pytest.fixture(scope="session")
def backbone(tmp_path_factory, tiny_digits):
    """A CNN pretrained for one epoch on the tiny digits' syn domain (PerAda's backbone)."""
    path = tmp_path_factory.mktemp("backbone") / "cnn-syn.pt"
    pretrain(tiny_digits, "syn", path, train=TrainConfig(batch_size=32), epochs=1)
    return path


#: one torch thread per test process, as runs use (threads=0, engine/compute.py): the
#: workers of ``-n auto`` are one per core, and a second thread each would only contend
torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    """Tests that start Flower processes run one after another on one xdist worker: they pick
    free ports and time their processes, which a second Flower test beside them would race."""
    for item in items:
        if item.get_closest_marker("flower") or "engine/flower/" in item.nodeid:
            item.add_marker(pytest.mark.xdist_group("flower"))
