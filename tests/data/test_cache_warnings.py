"""A Fundus or Prostate load from the image cache prints no warning (PyTorch's "The given
NumPy array is not writable" came from wrapping the read-only cache map, and a write to
such a tensor crashed the process). Torch warns once per process, so the test also checks
that every array handed to ``torch.from_numpy`` is writable."""

from __future__ import annotations

import warnings

import pytest
import torch
from test_catalog_segmentation_sets import SIDE, _fundus_tree, _prostate_tree

from fedshift.data import load_dataset


@pytest.mark.parametrize(("name", "make"), [("fundus", _fundus_tree), ("prostate", _prostate_tree)])
def test_a_cached_segmentation_load_prints_no_warning(tmp_path, monkeypatch, name, make):
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    root = make(tmp_path / name)
    first = load_dataset(name, data_root=root, image_size=SIDE, seed=0)  # decodes, caches
    wrapped: list[bool] = []
    from_numpy = torch.from_numpy

    def recording(array):
        wrapped.append(bool(array.flags.writeable))
        return from_numpy(array)

    monkeypatch.setattr(torch, "from_numpy", recording)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = load_dataset(name, data_root=root, image_size=SIDE, seed=0)  # from the cache
    monkeypatch.setattr(torch, "from_numpy", from_numpy)
    assert [str(w.message) for w in caught] == []
    assert wrapped and all(wrapped), wrapped
    for site in first.domains:
        assert again.meta["image_cache"][site].endswith(".npy")
        before, after = first.domain(site), again.domain(site)
        assert torch.equal(before.test.x, after.test.x)
        assert torch.equal(before.train.mask, after.train.mask)
        after.train.x[:1] += 1  # a write stays private: the cache file is unchanged
    third = load_dataset(name, data_root=root, image_size=SIDE, seed=0)
    for site in first.domains:
        assert torch.equal(third.domain(site).test.x, first.domain(site).test.x)
