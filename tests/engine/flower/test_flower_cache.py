"""The SuperNode's dataset cache: built once, memory-mapped, verified, rebuilt when corrupt."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="flwr is not installed; pip install -e '.[flower]'")

from fedshift.core.split import RowGather, dense  # noqa: E402
from fedshift.engine.flower.settings import load_run_dataset, parse_run_config  # noqa: E402
from fedshift.engine.flower.transport import node_cache  # noqa: E402


@pytest.fixture
def run(digits_cache):
    cfg, opts = parse_run_config(
        {"target": "optdigits", "device": "cpu", "max-samples": 40, "cache-dir": digits_cache}
    )
    builds = []

    def build():
        builds.append(1)
        return load_run_dataset(cfg, opts)

    return cfg, opts, build, builds


def assert_same(a, b):
    assert (a.name, a.classes, a.channels, a.image_size) == (
        b.name,
        b.classes,
        b.channels,
        b.image_size,
    )
    assert list(a.domains) == list(b.domains)
    for name in a.domains:
        for split in ("train", "val", "test"):
            sa, sb = a.domains[name].split(split), b.domains[name].split(split)
            for field in ("x", "y", "mask"):
                ta, tb = getattr(sa, field), getattr(sb, field)
                assert (ta is None) == (tb is None), (name, split, field)
                if ta is not None:
                    ta, tb = dense(ta), dense(tb)
                    assert ta.dtype == tb.dtype and torch.equal(ta, tb), (name, split, field)


def test_built_once_then_memory_mapped_and_equal(tmp_path, run):
    cfg, opts, build, builds = run
    first = node_cache.node_dataset(cfg, opts.max_samples, tmp_path, build)
    second = node_cache.node_dataset(cfg, opts.max_samples, tmp_path, build)
    assert len(builds) == 1
    assert_same(first, build())
    assert_same(second, first)
    folder = tmp_path / "flower-node" / node_cache.cache_key(cfg, opts.max_samples)
    files = json.loads((folder / node_cache.MANIFEST).read_text())["files"]
    assert files and all((folder / f).is_file() for f in files)
    x = next(iter(second.domains.values())).train.x
    assert isinstance(x, RowGather) and x.dtype == torch.uint8  # a read-only map, not a copy
    # reads copy: changing what a batch read never changes the cache
    before = (folder / "0-train-x.npy").read_bytes()
    batch = x[0:4]
    batch.add_(1)
    assert torch.equal(x[0:4], batch - 1)
    assert (folder / "0-train-x.npy").read_bytes() == before
    # another max-samples is another cache
    other = node_cache.node_dataset(cfg, 8, tmp_path, lambda: load_run_dataset(cfg, opts))
    assert len(next(iter(other.domains.values())).train) == 40  # built by the lambda given


def test_unchanged_cache_is_not_hashed_again(tmp_path, run, monkeypatch):
    cfg, opts, build, _ = run
    node_cache.node_dataset(cfg, opts.max_samples, tmp_path, build)
    hashed = []
    real = node_cache._sha256
    monkeypatch.setattr(node_cache, "_sha256", lambda p: hashed.append(p) or real(p))
    node_cache.node_dataset(cfg, opts.max_samples, tmp_path, build)
    assert hashed == []


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "manifest"])
def test_corrupt_cache_is_rebuilt(tmp_path, run, caplog, damage):
    cfg, opts, build, builds = run
    node_cache.node_dataset(cfg, opts.max_samples, tmp_path, build)
    folder = tmp_path / "flower-node" / node_cache.cache_key(cfg, opts.max_samples)
    target = folder / "1-train-x.npy"
    if damage == "flip":
        data = bytearray(target.read_bytes())
        data[-5] ^= 0xFF
        target.write_bytes(bytes(data))
    elif damage == "truncate":
        target.write_bytes(target.read_bytes()[:100])
    elif damage == "delete":
        target.unlink()
    else:
        (folder / node_cache.MANIFEST).write_text("{not json")
    with caplog.at_level(logging.WARNING):
        again = node_cache.node_dataset(cfg, opts.max_samples, tmp_path, build)
    assert len(builds) == 2
    assert any("rebuilding" in r.getMessage() for r in caplog.records)
    assert_same(again, build())
    assert np.load(target, allow_pickle=False).dtype == np.uint8


def test_a_late_builder_leaves_the_published_cache_alone(tmp_path, run):
    """Three SuperNodes of one machine share the cache and may build it at once: the one
    that finishes last uses the cache published first, never deletes it under the nodes
    reading it (before, it did: under load a node's task failed with "1-test-x.npy is
    missing")."""
    cfg, opts, build, builds = run
    first = node_cache.node_dataset(cfg, opts.max_samples, tmp_path, build)
    folder = tmp_path / "flower-node" / node_cache.cache_key(cfg, opts.max_samples)
    files = {p.name: p.stat().st_ino for p in folder.iterdir()}
    assert node_cache.write_cache(build(), folder) is False  # a late builder's cache
    assert {p.name: p.stat().st_ino for p in folder.iterdir()} == files
    assert [p.name for p in tmp_path.joinpath("flower-node").iterdir()] == [folder.name]
    assert_same(node_cache.node_dataset(cfg, opts.max_samples, tmp_path, build), first)
