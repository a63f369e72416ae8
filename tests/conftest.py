"""Shared fixtures: the digits-dg dataset built once per session into a temp cache."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from fedshift.data.domains import Domain, DomainDataset


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
