"""Bring your own data: torch Datasets and tensors as domains, with range checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from fedshift.core.split import dense
from fedshift.data import load_dataset, make_dataset, register_dataset
from fedshift.data.custom import _REGISTERED
from fedshift.data.domains import DatasetError


def tensors(n=20, size=8, low=0.0, high=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = low + (high - low) * torch.rand(n, 3, size, size, generator=g)
    return x, torch.arange(n) % 2


class PairDataset(torch.utils.data.Dataset):
    """A map-style dataset of (image, label) pairs, as torchvision's are."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


@pytest.fixture(autouse=True)
def no_registered_leftovers():
    yield
    _REGISTERED.clear()


def test_float_zero_one_images_are_scaled_to_uint8():
    x, y = tensors()
    x[0, 0, 0, 0], x[0, 0, 0, 1] = 0.0, 1.0
    ds = make_dataset({"a": {"train": (x, y), "val": (x, y), "test": (x, y)}})
    stored = ds.domain("a").train.x
    assert stored.dtype == torch.uint8
    assert stored[0, 0, 0, 0] == 0 and stored[0, 0, 0, 1] == 255
    assert torch.equal(stored, (x * 255).round().to(torch.uint8))
    assert ds.num_classes == 2 and ds.channels == 3 and ds.image_size == 8


def test_float_minus_one_one_images_are_mapped_back():
    x, y = tensors(low=-1.0, high=1.0)
    x[0, 0, 0, 0] = -1.0
    stored = make_dataset({"a": {"train": (x, y), "val": (x, y), "test": (x, y)}}).domain("a")
    assert stored.train.x[0, 0, 0, 0] == 0
    assert torch.equal(stored.train.x, ((x + 1) * 127.5).round().to(torch.uint8))


@pytest.mark.parametrize(("low", "high"), [(0.0, 255.0), (-2.1, 2.6)])
def test_float_images_out_of_range_name_the_domain_and_range(low, high):
    x, y = tensors(low=low, high=high)
    with pytest.raises(DatasetError, match=r"domain 'photos'.*\[0, 1\] or \[-1, 1\].*observed"):
        make_dataset({"photos": (x, y)})


def test_uint8_images_are_kept_and_one_split_is_cut_70_10_20():
    x = torch.randint(0, 256, (50, 1, 8, 8), dtype=torch.uint8)
    y = torch.arange(50) % 5
    domain = make_dataset({"a": (x, y), "b": (x, y)}, seed=3).domain("a")
    assert (len(domain.train), len(domain.val), len(domain.test)) == (35, 5, 10)
    together = torch.cat([dense(domain.train.x), dense(domain.val.x), dense(domain.test.x)])
    assert sorted(together.flatten().tolist()) == sorted(x.flatten().tolist())


def test_torch_dataset_of_tensors_pil_images_and_arrays():
    x, y = tensors(n=12)
    as_pil = [Image.fromarray((im.permute(1, 2, 0).numpy() * 255).astype(np.uint8)) for im in x]
    as_numpy = [(im.numpy() * 255).astype(np.uint8) for im in x]
    ds = make_dataset(
        {
            "tensors": PairDataset(x, [int(v) for v in y]),
            "pil": PairDataset(as_pil, y),  # labels as 0-d tensors
            "numpy": PairDataset(as_numpy, np.asarray(y)),
        }
    )
    assert ds.domain_names == ["tensors", "pil", "numpy"]
    assert all(len(d.train) + len(d.val) + len(d.test) == 12 for d in ds.domains.values())
    assert ds.domain("pil").train.x.dtype == torch.uint8


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (PairDataset([torch.zeros(3, 8, 8), torch.zeros(3, 9, 9)], [0, 1]), "differ in shape"),
        (PairDataset([torch.zeros(3, 8, 8)], ["cat"]), "label must be an integer"),
        (PairDataset(["not an image"], [0]), "image must be a tensor"),
        ([1, 2, 3], "item 0 must be \\(image, label\\)"),
        (object(), "expected a map-style torch Dataset"),
        (PairDataset([], []), "is empty"),
        (PairDataset([torch.full((3, 8, 8), float("nan"))], [0]), "NaN"),
    ],
)
def test_bad_datasets_are_one_clear_error(data, message):
    with pytest.raises(DatasetError, match=message):
        make_dataset({"mine": data})


def test_a_split_given_as_a_mapping_is_one_clear_error():
    x, y = tensors(n=4)
    split = {"x": x, "y": y}  # a mapping has __len__ and __getitem__ but is no dataset
    with pytest.raises(
        DatasetError, match=r"domain 'mine' \(train\).*got a mapping \(keys 'x', 'y'\)"
    ):
        make_dataset({"mine": {"train": split, "val": (x, y), "test": (x, y)}})


def test_segmentation_pairs_keep_masks():
    x, _ = tensors(n=10)
    masks = (x[:, 0] > 0.5).to(torch.uint8)
    ds = make_dataset({"a": PairDataset(x, masks)}, segmentation=True)
    split = ds.domain("a").train
    assert split.mask is not None and split.mask.shape == (7, 8, 8)
    with pytest.raises(DatasetError, match="only 0 and 1"):
        make_dataset({"a": PairDataset(x, masks * 3)}, segmentation=True)


def test_registered_dataset_loads_by_name_and_resizes():
    x, y = tensors()
    register_dataset("mine", lambda: {"a": (x, y), "b": (x, y)})
    ds = load_dataset("mine")
    assert ds.name == "mine" and ds.domain_names == ["a", "b"]
    assert load_dataset("mine", image_size=16).image_size == 16
    with pytest.raises(DatasetError, match="registered already"):
        register_dataset("mine", {"a": (x, y)})


def test_a_failing_loader_is_one_line():
    def broken():
        raise RuntimeError("disk on fire")

    register_dataset("broken", broken)
    with pytest.raises(DatasetError, match="dataset 'broken': its loader failed: RuntimeError"):
        load_dataset("broken")


def test_an_unknown_name_names_every_source_and_the_nearest_name():
    """One resolver: catalog -> registered/plug-in -> embedded -> folder; an unknown name is
    one error listing each source and suggesting the nearest name of any of them."""
    x, y = tensors()
    register_dataset("my-scans", lambda: {"a": (x, y), "b": (x, y)})
    with pytest.raises(DatasetError) as raised:
        load_dataset("pacss")
    message = str(raised.value)
    assert message.startswith("unknown dataset 'pacss' (did you mean 'pacs'?); catalog")
    assert "catalog (--set data_root=PATH): pacs," in message
    # installed plug-ins (CI installs examples/plugin's 'stripes') are listed beside it
    registered = message.split("registered or plug-in: ")[1].split(";")[0]
    assert "my-scans" in registered.split(", ")
    assert "embedded: digits-dg; or a folder: an existing directory" in message
    with pytest.raises(DatasetError, match=r"unknown dataset 'my-scan' \(did you mean 'my-scans'"):
        load_dataset("my-scan")
    with pytest.raises(DatasetError, match=r"\(did you mean 'digits-dg'\?\)"):
        load_dataset("digits_dg")
