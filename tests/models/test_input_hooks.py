"""The backbone's input hooks: ``normalize=mnist`` re-normalizes fedshift's [-1, 1] input with
MNIST's mean and std, and ``gray_input`` (the run key ``input_channels=1``) builds the
backbone with one input channel fed the mean over the image's channels, before any
normalization."""

from __future__ import annotations

import pytest
import torch

from fedshift.core.errors import ModelError
from fedshift.models import build_model
from fedshift.models.base import (
    MEAN_STD,
    GrayInput,
    MeanStdInput,
    set_gray_input,
    set_input_normalization,
)


def conv1_input(model, x: torch.Tensor) -> torch.Tensor:
    """What the model's first convolution receives for input ``x``."""
    seen = []
    handle = model.backbone.conv1.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        model.eval()
        with torch.no_grad():
            model(x)
    finally:
        handle.remove()
    return seen[0]


def test_mnist_normalization_exact_values_on_hand_inputs():
    hook = MeanStdInput(*MEAN_STD["mnist"])
    x = torch.tensor([-1.0, 0.0, 1.0, -0.5]).view(1, 1, 2, 2).repeat(1, 3, 1, 1)
    (out,) = hook(None, (x,))
    # x01 = (x + 1) / 2 = 0, 0.5, 1, 0.25 -> (x01 - 0.1307) / 0.3081, on every channel
    expected = torch.tensor(
        [-0.1307 / 0.3081, 0.3693 / 0.3081, 0.8693 / 0.3081, 0.1193 / 0.3081]
    ).view(1, 1, 2, 2)
    assert torch.allclose(out, expected.expand(1, 3, 2, 2), atol=1e-6, rtol=0)
    assert abs(out[0, 0, 0, 0].item() - (-0.42421291788380395)) < 1e-6
    assert abs(out[0, 2, 1, 0].item() - 2.8214865303472897) < 1e-6


def test_a_model_with_mnist_normalization_feeds_its_first_layer_the_normalized_input():
    model = build_model("fedproto-cnn", 10, in_channels=3, image_size=28, normalize="mnist")
    assert model.input_normalization == "mnist"
    x = torch.full((2, 3, 28, 28), -1.0)
    x[:, 1] = 0.0
    x[:, 2] = 1.0
    seen = conv1_input(model, x)
    assert seen.shape == (2, 3, 28, 28)
    for channel, x01 in enumerate((0.0, 0.5, 1.0)):
        value = (x01 - 0.1307) / 0.3081
        assert torch.allclose(seen[:, channel], torch.full((2, 28, 28), value), atol=1e-6)
    state = build_model("fedproto-cnn", 10, in_channels=3, image_size=28).state_dict()
    assert list(model.state_dict()) == list(state)  # a hook: no tensor is added


def test_the_imagenet_hook_is_the_mean_std_hook_with_imagenets_statistics():
    model = build_model("cnn", 3, image_size=16, normalize="imagenet")
    [hook] = model.backbone._forward_pre_hooks.values()
    assert isinstance(hook, MeanStdInput)
    assert (hook.mean, hook.std) == MEAN_STD["imagenet"]


def test_input_channels_one_builds_conv1_with_one_channel_and_equals_a_one_channel_model():
    gray = build_model(
        "fedproto-cnn", 10, in_channels=3, image_size=28, gray_input=True, normalize="mnist"
    ).eval()
    assert gray.backbone.conv1.in_channels == 1
    assert gray.gray_input
    hooks = list(gray.backbone._forward_pre_hooks.values())
    assert [type(h) for h in hooks] == [GrayInput, MeanStdInput]  # gray first
    single = build_model("fedproto-cnn", 10, in_channels=1, image_size=28, normalize="mnist")
    single.load_state_dict(gray.state_dict())  # the same tensors: hooks hold none
    single.eval()
    one = torch.rand(5, 1, 28, 28, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        ours = gray(one.expand(-1, 3, -1, -1).contiguous())
        hand = single(one)
        assert torch.allclose(ours, hand, atol=1e-6, rtol=0)
        features = gray.features(one.repeat(1, 3, 1, 1))
        assert torch.allclose(features, single.features(one), atol=1e-6, rtol=0)
    # the hand-built model normalized by hand: (x01 - 0.1307) / 0.3081 on the single channel
    plain = build_model("fedproto-cnn", 10, in_channels=1, image_size=28)
    plain.load_state_dict(gray.state_dict())
    plain.eval()
    with torch.no_grad():
        by_hand = plain(((one + 1) / 2 - 0.1307) / 0.3081)
    assert torch.allclose(ours, by_hand, atol=1e-5, rtol=0)


def test_the_gray_hook_runs_before_a_normalization_set_earlier():
    model = build_model("fedproto-cnn", 10, in_channels=1, image_size=28, normalize="mnist")
    set_gray_input(model)
    set_gray_input(model)  # once
    hooks = list(model.backbone._forward_pre_hooks.values())
    assert [type(h) for h in hooks] == [GrayInput, MeanStdInput]
    x = torch.stack([torch.full((28, 28), v) for v in (-1.0, 0.0, 1.0)]).unsqueeze(0)
    seen = conv1_input(model, x)
    assert seen.shape == (1, 1, 28, 28)  # the mean over channels: 0 -> x01 = 0.5
    assert torch.allclose(seen, torch.full_like(seen, (0.5 - 0.1307) / 0.3081), atol=1e-6)


def test_gray_input_of_a_one_channel_dataset_adds_no_hook():
    model = build_model("fedproto-cnn", 10, in_channels=1, image_size=28, gray_input=True)
    assert model.backbone.conv1.in_channels == 1
    assert not model.gray_input and not model.backbone._forward_pre_hooks


def test_bad_combinations_are_one_line_errors():
    with pytest.raises(ModelError) as raised:
        build_model("cnn", 3, in_channels=3, gray_input=True, normalize="imagenet")
    message = "normalize=imagenet needs 3 input channels, got 1 (input_channels=1)"
    assert str(raised.value) == message
    with pytest.raises(ModelError, match=r"choose one of: auto, symmetric, imagenet, mnist$"):
        build_model("cnn", 3, normalize="mnsit")
    model = build_model("cnn", 3, normalize="mnist")
    assert set_input_normalization(model, "mnist") is model  # the same again: a no-op
    with pytest.raises(ModelError, match="mnist input normalization cannot be changed"):
        set_input_normalization(model, "imagenet")
    with pytest.raises(ModelError, match="mnist input normalization cannot be changed"):
        set_input_normalization(model, "symmetric")
