"""Model zoo: shapes, key prefixes, seeded init, weight files, errors."""

from __future__ import annotations

import pytest
import torch
from torchvision import models as tvm

from fedshift.core.errors import ModelError
from fedshift.models import MODELS, FedModel, build_model, normalize_input

EMBED = {
    "cnn": 256,
    "digit5-cnn": 2048,
    "fact-cnn": 8192,
    "fedproto-cnn": 50,
    "resnet18": 512,
    "resnet50": 2048,
}
# resnet18 is tested with the 32-px (CIFAR) stem; resnet50 with the ImageNet stem, which on
# 32-px input is ~30x cheaper on CPU and keeps the fast tier fast
OPTS = {"resnet18": {"small_input": True}}


def _build(name: str, num_classes: int = 7, **kw) -> FedModel:
    return build_model(name, num_classes, **{**OPTS.get(name, {}), **kw})


def _batch(n: int = 2, c: int = 3, size: int = 32, seed: int = 123) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, size, size, generator=g)


def test_registry_matches_expected_names():
    # unet (segmentation, per-pixel outputs) is tested in test_segmentation.py, the
    # EfficientNet-Lite backbones (timm) in test_timm_backbones.py
    lite = {"efficientnet-lite0", "efficientnet-lite1", "efficientnet-lite2"}
    assert set(MODELS) == set(EMBED) | {"unet", "alexnet"} | lite
    assert all(isinstance(v, str) and v for v in MODELS.values())


@pytest.mark.parametrize("name", sorted(EMBED))
def test_shapes_and_key_prefixes(name):
    torch.manual_seed(0)
    model = _build(name).eval()
    assert isinstance(model, FedModel)
    assert model.embed_dim == EMBED[name] and model.num_classes == 7
    x = _batch()
    with torch.no_grad():
        f = model.features(x)
        logits = model.classifier(f)
        out = model(x)
    assert f.shape == (2, EMBED[name])
    assert logits.shape == (2, 7)
    torch.testing.assert_close(out, logits, rtol=0, atol=0)
    assert torch.isfinite(out).all()
    keys = list(model.state_dict())
    assert keys and all(k.startswith(("backbone.", "head.")) for k in keys)
    assert any(k.startswith("head.") for k in keys)


@pytest.mark.parametrize("name", sorted(EMBED))
def test_same_seed_same_init(name):
    torch.manual_seed(5)
    a = _build(name).state_dict()
    torch.manual_seed(5)
    b = _build(name).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    torch.manual_seed(6)
    c = _build(name).state_dict()
    assert any(not torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("name", sorted(EMBED))
def test_weights_round_trip(name, tmp_path):
    torch.manual_seed(1)
    src = _build(name).train()
    # move BN running stats away from their defaults so the round trip covers buffers too
    with torch.no_grad():
        src(_batch(n=4))
    src.eval()
    path = tmp_path / f"{name}.pt"
    torch.save(src.state_dict(), path)
    torch.manual_seed(2)
    dst = _build(name, weights_path=str(path)).eval()
    x = _batch(seed=9)
    with torch.no_grad():
        torch.testing.assert_close(dst(x), src(x), rtol=0, atol=0)
        torch.testing.assert_close(dst.features(x), src.features(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("size", "channels", "flat"),
    [(28, 1, 128 * 3 * 3), (32, 3, 128 * 4 * 4), (64, 3, 128 * 8 * 8)],
)
def test_cnn_image_sizes(size, channels, flat):
    model = build_model("cnn", 10, in_channels=channels, image_size=size).eval()
    assert model.backbone.fc.in_features == flat
    with torch.no_grad():
        assert model.features(_batch(c=channels, size=size)).shape == (2, 256)


def test_cnn_options():
    model = build_model("cnn", 4, embed_dim=64, width=0.5).eval()
    assert model.embed_dim == 64 and model.backbone.conv1.out_channels == 16
    with torch.no_grad():
        assert model(_batch()).shape == (2, 4)


def test_digit5_cnn_matches_reference_sizes():
    model = build_model("digit5-cnn", 10)
    assert model.backbone.fc1.in_features == 8192
    assert model.backbone.fc1.out_features == 3072
    assert model.backbone.fc2.out_features == 2048
    assert isinstance(model.head, torch.nn.Linear) and model.head.in_features == 2048


@pytest.mark.parametrize(("size", "flat"), [(28, 320), (32, 500)])
def test_fedproto_cnn_sizes_and_heterogeneity(size, flat):
    model = build_model("fedproto-cnn", 10, in_channels=1, image_size=size).eval()
    assert model.backbone.fc1.in_features == flat
    variant = build_model(
        "fedproto-cnn", 10, in_channels=1, image_size=size, out_channels=(10, 24)
    ).eval()
    with torch.no_grad():
        assert model.features(_batch(c=1, size=size)).shape == (2, 50)
        assert variant.features(_batch(c=1, size=size)).shape == (2, 50)


def test_resnet_stems():
    big = build_model("resnet18", 5).eval()
    small = build_model("resnet18", 5, small_input=True).eval()
    assert big.backbone.conv1.kernel_size == (7, 7)
    assert small.backbone.conv1.kernel_size == (3, 3)
    assert isinstance(small.backbone.maxpool, torch.nn.Identity)
    gray = build_model("resnet18", 5, in_channels=1).eval()
    with torch.no_grad():
        assert big(_batch()).shape == (2, 5)
        assert gray.features(_batch(c=1)).shape == (2, 512)


def test_torchvision_resnet18_state_dict_loads(tmp_path):
    torch.manual_seed(3)
    tv = tvm.resnet18(weights=None, num_classes=5).eval()
    path = tmp_path / "tv.pt"
    torch.save(tv.state_dict(), path)
    ours = build_model("resnet18", 5, weights_path=path).eval()
    x = _batch(seed=4)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), tv(x), rtol=0, atol=0)


def test_alexnet_matches_torchvision_and_refuses_tiny_images(tmp_path):
    torch.manual_seed(5)
    tv = tvm.alexnet(weights=None, num_classes=6).eval()
    path = tmp_path / "alexnet.pt"
    torch.save(tv.state_dict(), path)
    ours = build_model("alexnet", 6, image_size=64, weights_path=path).eval()
    assert ours.embed_dim == 4096
    x = _batch(size=64, seed=6)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), tv(x), rtol=0, atol=0)
        assert ours.features(x).shape == (2, 4096)
    assert sorted(k for k in ours.state_dict() if k.startswith("head.")) == [
        "head.bias",
        "head.weight",
    ]
    with pytest.raises(ModelError, match="at least 63 px"):
        build_model("alexnet", 6, image_size=32)


def _fake_imagenet_file(folder, monkeypatch, arch="resnet18"):
    """torchvision-layout weights saved under a name whose hash matches their content."""
    import hashlib
    from dataclasses import replace

    from fedshift.models.cards import CARDS

    torch.manual_seed(8)
    tv = tvm.resnet18(weights=None).eval()
    staging = folder / "staging.pth"
    torch.save(tv.state_dict(), staging)
    digest = hashlib.sha256(staging.read_bytes()).hexdigest()[:8]
    checkpoints = folder / "hub" / "checkpoints"
    checkpoints.mkdir(parents=True)
    name = f"{arch}-{digest}.pth"
    staging.rename(checkpoints / name)
    monkeypatch.setenv("TORCH_HOME", str(folder))
    card = CARDS[arch]
    monkeypatch.setitem(CARDS, arch, replace(card, weights=replace(card.weights, file=name)))
    return tv, checkpoints / name


def test_imagenet_weights_come_from_torchs_cache_checked_by_hash(tmp_path, monkeypatch):
    tv, path = _fake_imagenet_file(tmp_path, monkeypatch)
    with pytest.warns(UserWarning, match="head not loaded"):  # 1000 ImageNet classes
        ours = build_model("resnet18", 5, weights_path="imagenet").eval()
    tv.fc = torch.nn.Identity()
    x = _batch(seed=9)
    with torch.no_grad():
        torch.testing.assert_close(ours.features(x), tv(x), rtol=0, atol=0)
    path.write_bytes(path.read_bytes()[:-1] + b"x")
    with pytest.raises(ModelError, match="does not match the hash in its name"):
        build_model("resnet18", 5, weights_path="imagenet")
    path.unlink()
    with pytest.raises(ModelError, match=f"put the file {path.name} at {path}"):
        build_model("resnet18", 5, weights_path="imagenet")
    with pytest.raises(ModelError, match="no ImageNet weights for model 'cnn'"):
        build_model("cnn", 5, weights_path="imagenet")


def test_torchvision_head_mismatch_skips_head_with_warning(tmp_path):
    torch.manual_seed(3)
    tv = tvm.resnet18(weights=None).eval()  # 1000-class fc
    path = tmp_path / "tv1000.pt"
    torch.save({"state_dict": tv.state_dict()}, path)  # wrapped checkpoint is accepted too
    with pytest.warns(UserWarning, match="head not loaded"):
        ours = build_model("resnet18", 5, weights_path=path).eval()
    x = _batch(seed=4)
    with torch.no_grad():
        tv.fc = torch.nn.Identity()
        torch.testing.assert_close(ours.features(x), tv(x), rtol=0, atol=0)


def test_missing_file_is_value_error(tmp_path):
    with pytest.raises(ModelError, match="not found"):
        build_model("cnn", 10, weights_path=tmp_path / "nope.pt")


def test_garbage_file_is_value_error(tmp_path):
    path = tmp_path / "garbage.pt"
    path.write_bytes(b"this is not a torch file")
    with pytest.raises(ModelError, match="could not read weights file"):
        build_model("cnn", 10, weights_path=path)
    path2 = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), path2)
    with pytest.raises(ModelError, match="does not hold a state_dict"):
        build_model("cnn", 10, weights_path=path2)


def test_incompatible_keys_are_value_error(tmp_path):
    path = tmp_path / "cnn.pt"
    torch.save(build_model("cnn", 10).state_dict(), path)
    with pytest.raises(ModelError, match="does not fit model 'digit5-cnn'.*missing keys"):
        build_model("digit5-cnn", 10, weights_path=path)
    with pytest.raises(ModelError, match="shape mismatches.*backbone.fc"):
        build_model("cnn", 10, embed_dim=128, weights_path=path)
    tv_path = tmp_path / "tv.pt"
    torch.save(tvm.resnet18(weights=None).state_dict(), tv_path)
    with pytest.raises(ModelError, match="torchvision-style.*only fits"):
        build_model("cnn", 10, weights_path=tv_path)
    with pytest.raises(ModelError, match="shape mismatches.*backbone.conv1.weight"):
        build_model("resnet18", 10, small_input=True, weights_path=tv_path)


def test_unknown_name_and_option():
    with pytest.raises(ModelError, match="unknown model 'vgg'; choose one of: cnn, digit5-cnn"):
        build_model("vgg", 10)
    with pytest.raises(ModelError, match="unknown option.*'depth'.*accepted options: embed_dim"):
        build_model("cnn", 10, depth=3)
    with pytest.raises(ModelError, match="image_size >= 16"):
        build_model("fedproto-cnn", 10, image_size=12)


def test_normalize_input_range():
    x = torch.tensor([[[[0, 255], [128, 51]]]], dtype=torch.uint8)
    y = normalize_input(x)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert y.min().item() == -1.0 and y.max().item() == 1.0
    torch.testing.assert_close(y, (x.float() / 255 - 0.5) / 0.5)
    with pytest.raises(ModelError, match="uint8"):
        normalize_input(x.float())
