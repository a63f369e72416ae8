"""Lazy client shares: ``Split.subset`` / ``concat_splits`` are RowGather views that read
exactly what eager indexing would, and copy no pixels until a batch is read."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from fedshift.config import resolve
from fedshift.core.context import SplitView
from fedshift.core.split import RowGather, Split, concat_splits, dense
from fedshift.data.catalog import CATALOG
from fedshift.engine.assembly import prepare


def _split(n: int, seed: int, size: int = 2) -> Split:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)
    mask = torch.randint(0, 2, (n, size, size), dtype=torch.uint8, generator=g)
    return Split(x=x, y=torch.randint(0, 10, (n,), generator=g), mask=mask)


def _eager_subset(split: Split, idx: list[int]) -> Split:
    t = torch.as_tensor(idx, dtype=torch.long)
    return Split(x=dense(split.x)[t], y=split.y[t], mask=dense(split.mask)[t])


def _eager_concat(splits: list[Split]) -> Split:
    return Split(
        x=torch.cat([dense(s.x) for s in splits]),
        y=torch.cat([s.y for s in splits]),
        mask=torch.cat([dense(s.mask) for s in splits]),
    )


@st.composite
def _plans(draw):
    """A few base splits and a random sequence of subsets and concatenations of them."""
    sizes = draw(st.lists(st.integers(0, 12), min_size=1, max_size=3))
    steps = draw(st.lists(st.tuples(st.booleans(), st.integers(0, 2**16)), max_size=5))
    return sizes, steps


def _indices(n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    if n == 0:
        return []
    count = int(rng.integers(0, 2 * n + 1))
    return rng.integers(-n, n, count).tolist()  # repeats and negative indices included


@settings(max_examples=60, deadline=None)
@given(_plans(), st.integers(0, 2**16))
def test_lazy_views_read_what_eager_indexing_reads(plan, read_seed):
    sizes, steps = plan
    lazy = [_split(n, seed) for seed, n in enumerate(sizes)]
    eager = list(lazy)
    for concat, seed in steps:
        pick = seed % len(lazy)
        if concat:
            others = [(pick + k) % len(lazy) for k in range(1 + seed % 3)]
            lazy.append(concat_splits([lazy[k] for k in others]))
            eager.append(_eager_concat([eager[k] for k in others]))
        else:
            idx = _indices(len(lazy[pick]), seed)
            lazy.append(lazy[pick].subset(idx))
            eager.append(_eager_subset(eager[pick], idx))
    for view, expected in zip(lazy, eager, strict=True):
        n = len(expected)
        assert view.x.shape == expected.x.shape and view.x.dtype == torch.uint8
        assert torch.equal(dense(view.x), expected.x) and torch.equal(view.y, expected.y)
        assert torch.equal(dense(view.mask), expected.mask)
        idx = torch.as_tensor(_indices(n, read_seed), dtype=torch.long)
        assert torch.equal(view.x[idx], expected.x[idx])
        assert torch.equal(view.mask[idx], expected.mask[idx])
        start, stop, step = read_seed % 5, read_seed % 11, 1 + read_seed % 3
        assert torch.equal(view.x[start:stop:step], expected.x[start:stop:step])
        chosen = torch.arange(n) % 2 == read_seed % 2
        assert torch.equal(view.x[chosen], expected.x[chosen])
        if n:
            i = read_seed % n
            assert torch.equal(view.x[i], expected.x[i])
            assert torch.equal(view.x[i, 1], expected.x[i, 1])
            assert torch.equal(view.x[:, 0, 1], expected.x[:, 0, 1])
            assert torch.equal(view.x[..., 0], expected.x[..., 0])


def test_a_subset_holds_the_stored_tensor_and_an_index_not_pixels():
    base = _split(50, 0)
    share = base.subset([4, 2, 2, -1])
    assert isinstance(share.x, RowGather) and share.x.sources[0] is base.x
    assert share.x.rows.tolist() == [4, 2, 2, 49]
    assert share.subset([1, 0]).x.sources[0] is base.x  # a subset of a subset: still one
    pooled = concat_splits([share, base.subset([7]), _split(3, 1)])
    assert len(pooled.x.sources) == 2 and pooled.x.sources[0] is base.x
    read = share.x[torch.tensor([0])]
    read += 1  # a batch read is a copy: the stored pixels never change
    assert torch.equal(base.x[4], share.x[0]) and not torch.equal(read[0], base.x[4])
    with pytest.raises(IndexError, match="out of bounds"):
        base.subset([50])
    with pytest.raises(IndexError, match="out of bounds"):
        share.subset([-5])


def _rss_anon_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_shares_of_a_memory_mapped_domain_copy_no_pixels(tmp_path):
    """Four clients' shares of a 158 MiB memory-mapped domain (and a pooled client of two):
    building them adds no anonymous memory (copies, not the file's pages), and an epoch over
    each adds about a batch's worth (the allocator keeps some), where eager shares would copy
    237 MiB."""
    n, size = 6000, 96  # 6000 x 3 x 96 x 96 bytes = 158 MiB
    path = tmp_path / "domain.npy"
    pixels = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(n, 3, size, size))
    for start in range(0, n, 1000):
        pixels[start : start + 1000] = np.arange(start, min(n, start + 1000))[:, None, None, None]
    pixels.flush()
    del pixels
    stored = torch.from_numpy(np.load(path, mmap_mode="c"))
    domain = Split(x=stored, y=torch.arange(n) % 256)  # image i is filled with i % 256
    before = _rss_anon_mib()
    parts = torch.randperm(n, generator=torch.Generator().manual_seed(0)).chunk(4)
    shares = [domain.subset(part) for part in parts]
    shares.append(concat_splits(shares[:2]))  # a pooled client of two shares
    built = _rss_anon_mib() - before
    seen = 0
    for share in shares:
        view = SplitView(share, labeled=True, device=torch.device("cpu"))
        for x, y in view.batches(32, torch.Generator().manual_seed(1)):
            assert torch.equal(((x[:, 0, 0, 0] + 1) * 127.5).round().long(), y)
            seen += len(x)
    for share, part in zip(shares, parts, strict=False):
        assert torch.equal(share.x[:3], stored[part[:3]])
    grown = _rss_anon_mib() - before
    assert seen == n + n // 2
    assert built < 4, f"building the shares took {built:.1f} MiB of anonymous memory"
    assert grown < 60, f"anonymous memory grew by {grown:.1f} MiB over a 158 MiB domain"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_run_on_a_cached_catalog_tree_gives_clients_views_of_the_cache(tmp_path, monkeypatch):
    """``prepare`` on a memory-mapped VLCS tree: every client's images are a RowGather over
    the cached domain arrays, and its batches read the cached pixels."""
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    for domain in CATALOG["vlcs"].domains:
        for label, name in enumerate(("bird", "car", "dog")):
            folder = tmp_path / "data" / domain / name
            folder.mkdir(parents=True)
            for i in range(6):
                colour = (40 * label, 30 * i, 20)
                Image.new("RGB", (8, 8), colour).save(folder / f"{i}.png")
    settings_ = ["dataset=vlcs", f"data_root={tmp_path / 'data'}", "image_size=8"]
    settings_ += ["target=SUN09", "clients_per_domain=2", "rounds=1", "threads=1"]
    exp = prepare(resolve(None, {}, settings_))
    assert all(p.endswith(".npy") for p in exp.dataset.meta["image_cache"].values())
    stored = {id(exp.dataset.domain(d).train.x.sources[0]) for d in exp.dataset.domain_names}
    assert len(exp.contexts) == 6
    for ctx in exp.contexts.values():
        share = ctx.train.x
        assert isinstance(share, RowGather) and {id(s) for s in share.sources} <= stored
        (domain,) = exp.dataset.domain(ctx.domain).train.x.sources  # the whole mapped file
        assert torch.equal(share[:], domain[share.rows])
        path, mode = _mapped_file(domain.data_ptr())
        assert path == exp.dataset.meta["image_cache"][ctx.domain] and mode.startswith("r-")


def _mapped_file(address: int) -> tuple[str, str]:
    """(the file whose memory map holds ``address`` in this process, its permissions)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        start, stop = (int(part, 16) for part in fields[0].split("-"))
        if start <= address < stop:
            return (fields[5].strip() if len(fields) == 6 else ""), fields[1]
    return "", ""
