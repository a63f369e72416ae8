"""Every shipped paper preset runs one round end to end on a generated copy of its dataset
(``slow`` tier): the preset's algorithm, protocol, partition, model and hyperparameters, with
only what a tiny tree cannot hold overridden (image size, batch, one local epoch, FedProto's
shots; no ImageNet weights file exists in tests)."""

from __future__ import annotations

import json

import pytest
import torch
from test_catalog_cifar import _cifar10
from test_catalog_digit_five import _tree as _digit_five_tree
from test_catalog_segmentation_sets import _fundus_tree, _prostate_tree
from test_presets import _folder_tree, _pacs_tree

from fedshift.cli import main
from fedshift.models import build_model
from fedshift.presets import load_preset, preset_names

TREES = {
    "pacs": _pacs_tree,
    "office-home": lambda root: _folder_tree("office-home", root),
    "office-caltech10": lambda root: _folder_tree("office-caltech10", root),
    "digit-five": _digit_five_tree,
    "fundus": _fundus_tree,
    "prostate": _prostate_tree,
    "cifar10": _cifar10,
}
#: what a tree of three images per class cannot give FedProto's N-way K-shot clients
TINY_NWAY = ["clients_per_domain=3", "shots=1", "ways=2", "stdev=0"]

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", preset_names())
def test_shipped_preset_runs_one_round_on_its_generated_dataset(name, tmp_path, monkeypatch):
    monkeypatch.setenv("FEDSHIFT_CACHE", str(tmp_path / "cache"))
    preset = load_preset(name)
    dataset = preset.dataset.split(":")[0]
    TREES[dataset](tmp_path / "data")
    size = 32 if dataset in ("digit-five", "cifar10") else 64
    settings = [f"data_root={tmp_path / 'data'}", "model_weights=", f"image_size={size}"]
    settings += ["batch_size=4", "local_epochs=1", "threads=1", "tracking=none"]
    if preset.settings.get("partition") == "nway-kshot":
        settings += TINY_NWAY
    if name == "bd-fedproto-cifar10":
        # from random weights, a ResNet-18 whose BatchNorm statistics saw two batches gives
        # prototypes beyond max_reply_value (1e10 .. 1e18): the preset needs its pretrained
        # backbone, which tests do not have
        settings.append("model=cnn")
    if preset.settings.get("client_data_fraction", 1.0) != 1.0:  # 1 % of a few images is one
        settings.append("client_data_fraction=1.0")
    if preset.algorithm == "perada":
        weights = tmp_path / "backbone.pt"
        model = build_model(preset.settings["model"], 3, image_size=size)
        torch.save(model.state_dict(), weights)
        settings.append(f"algo.backbone={weights}")
    argv = ["run", "--preset", name, "--rounds", "1", "--quiet", "--out", str(tmp_path / "run")]
    for setting in settings:
        argv += ["--set", setting]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["preset"] == name and saved["algorithm"] == preset.algorithm
    assert summary["rounds"] == 1 and summary["target_accuracy_last"] is not None
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1
