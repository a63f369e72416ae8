"""AdaIN style transfer (Huang & Belongie, ICCV 2017): statistics, the AdaIN operator and the
VGG-19 encoder / mirrored decoder architectures of the original model.

The architectures match the layer order of the public AdaIN weight files
(``vgg_normalised.pth``, ``decoder.pth``), so those state dicts load unchanged. Nothing here
downloads anything: :func:`load_adain_networks` reads local files only.
"""

from __future__ import annotations

import os

from torch import Tensor, nn

from fedshift.core.errors import ModelError

from .weights import read_state_file

__all__ = [
    "ADAIN_EPS",
    "VGG_RELU4_1_LAYERS",
    "adain",
    "adain_decoder",
    "instance_style",
    "load_adain_networks",
    "pooled_style",
    "vgg_encoder",
]

#: added to every variance before the square root (the official AdaIN / CCST value)
ADAIN_EPS = 1e-5
#: children of the full VGG-19 ``Sequential`` kept by AdaIN: conv1x1 ... relu4_1
VGG_RELU4_1_LAYERS = 31


def instance_style(feat: Tensor, eps: float = ADAIN_EPS) -> tuple[Tensor, Tensor]:
    """Per-sample, per-channel mean and std of ``feat`` ``(N, C, H, W)``, each ``(N, C)``.

    The std uses the unbiased variance plus ``eps`` (the AdaIN reference implementation).
    """
    flat = feat.flatten(2)
    return flat.mean(dim=2), (flat.var(dim=2) + eps).sqrt()


def pooled_style(
    feat_sum: Tensor, feat_sq_sum: Tensor, count: int, eps: float = ADAIN_EPS
) -> tuple[Tensor, Tensor]:
    """Channel mean and std over every pixel of many images from running sums, each ``(C,)``.

    ``feat_sum`` / ``feat_sq_sum`` are per-channel sums of values and squared values over
    ``count`` pixels; std = sqrt(E[x²] − E[x]² + eps) (population variance, as CCST's
    overall domain style).
    """
    mean = feat_sum / count
    var = (feat_sq_sum / count - mean.pow(2)).clamp_min(0.0)
    return mean, (var + eps).sqrt()


def adain(
    content: Tensor,
    style_mean: Tensor,
    style_std: Tensor,
    alpha: float = 1.0,
    eps: float = ADAIN_EPS,
) -> Tensor:
    """AdaIN: σ_s·(x − μ_x)/σ_x + μ_s per sample and channel, blended as α·AdaIN + (1−α)·x.

    ``content`` is ``(N, C, H, W)``; ``style_mean`` / ``style_std`` are ``(N, C)`` (one target
    style per sample) or ``(C,)`` (one for all). μ_x, σ_x come from :func:`instance_style`.
    """
    c_mean, c_std = instance_style(content, eps)
    s_mean = style_mean.expand_as(c_mean)[..., None, None]
    s_std = style_std.expand_as(c_std)[..., None, None]
    stylized = (content - c_mean[..., None, None]) / c_std[..., None, None] * s_std + s_mean
    return alpha * stylized + (1.0 - alpha) * content if alpha != 1.0 else stylized


def _conv(cin: int, cout: int) -> list[nn.Module]:
    return [nn.ReflectionPad2d((1, 1, 1, 1)), nn.Conv2d(cin, cout, (3, 3)), nn.ReLU()]


def _pool() -> nn.Module:
    return nn.MaxPool2d((2, 2), (2, 2), (0, 0), ceil_mode=True)


def _up() -> nn.Module:
    return nn.Upsample(scale_factor=2, mode="nearest")


def vgg_encoder() -> nn.Sequential:
    """The "normalised" VGG-19 of AdaIN up to relu4_1 (31 children, input RGB in [0, 1]).

    Child indices equal those of the full network, so the first 31 children's keys of the
    public ``vgg_normalised.pth`` (``0.weight`` ... ``29.bias``) load directly.
    """
    layers: list[nn.Module] = [nn.Conv2d(3, 3, (1, 1))]
    layers += _conv(3, 64) + _conv(64, 64) + [_pool()]
    layers += _conv(64, 128) + _conv(128, 128) + [_pool()]
    layers += _conv(128, 256) + _conv(256, 256) + _conv(256, 256) + _conv(256, 256) + [_pool()]
    layers += _conv(256, 512)
    return nn.Sequential(*layers)


def adain_decoder() -> nn.Sequential:
    """The AdaIN decoder: relu4_1 features (512 channels) back to an RGB image (×8 upsampling)."""
    layers: list[nn.Module] = _conv(512, 256) + [_up()]
    layers += _conv(256, 256) + _conv(256, 256) + _conv(256, 256) + _conv(256, 128) + [_up()]
    layers += _conv(128, 128) + _conv(128, 64) + [_up()]
    layers += _conv(64, 64) + [nn.ReflectionPad2d((1, 1, 1, 1)), nn.Conv2d(64, 3, (3, 3))]
    return nn.Sequential(*layers)


def _read_state_dict(path: str | os.PathLike, what: str) -> dict[str, Tensor]:
    """The tensors of a VGG or decoder file, read under the guard of every weight file."""
    try:
        return read_state_file(path)
    except ModelError as exc:
        raise ModelError(f"{what}: {exc}") from None


def _past_relu4_1(key: str) -> bool:
    index = key.split(".", 1)[0]
    return index.isdigit() and int(index) >= VGG_RELU4_1_LAYERS


def load_adain_networks(
    vgg_path: str | os.PathLike, decoder_path: str | os.PathLike
) -> tuple[nn.Sequential, nn.Sequential]:
    """The VGG encoder (to relu4_1) and decoder loaded from local state-dict files, in eval mode.

    The VGG file may hold the full VGG-19 (keys of children past relu4_1 are ignored) or just
    the first 31 children; any missing or misshaped key is an error naming it.
    """
    encoder, decoder = vgg_encoder(), adain_decoder()
    vgg_state = {k: v for k, v in _read_state_dict(vgg_path, "VGG").items() if not _past_relu4_1(k)}
    for name, net, state in (
        ("VGG", encoder, vgg_state),
        ("decoder", decoder, _read_state_dict(decoder_path, "decoder")),
    ):
        try:
            net.load_state_dict(state)
        except RuntimeError as exc:
            first = str(exc).splitlines()[0]
            raise ModelError(f"{name} weights do not fit the AdaIN architecture: {first}") from exc
        net.eval().requires_grad_(False)
    return encoder, decoder
