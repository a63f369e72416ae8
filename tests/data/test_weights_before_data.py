"""A run whose weight file is missing says so before it loads (decodes) its dataset."""

from __future__ import annotations

import pytest
from test_catalog_loaders import _pacs_tree

from fedshift.cli import main
from fedshift.data.catalog.base import CatalogDataset


@pytest.fixture
def loads(monkeypatch, tmp_path) -> list[str]:
    """Every catalog load the run asks for (none may happen); an empty torch cache."""
    called: list[str] = []

    def load(self, root, options):
        called.append(self.name)
        raise AssertionError("the dataset was loaded before the weights were checked")

    monkeypatch.setattr(CatalogDataset, "load", load)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty-torch-home"))
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    return called


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ("imagenet", "torchvision's resnet18 ImageNet weights are not on this machine"),
        ("/nowhere/resnet18.pt", "weights file not found: '/nowhere/resnet18.pt'"),
    ],
)
def test_missing_weights_are_reported_before_the_dataset_loads(
    tmp_path, capsys, loads, weights, message
):
    _pacs_tree(tmp_path / "pacs")
    argv = ["run", "-d", "pacs", "-t", "sketch", "--rounds", "1", "--quiet"]
    argv += ["--out", str(tmp_path / "run")]
    for setting in (
        f"data_root={tmp_path / 'pacs'}",
        "model=resnet18",
        f"model_weights={weights}",
        "image_size=16",
    ):
        argv += ["--set", setting]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert loads == []
