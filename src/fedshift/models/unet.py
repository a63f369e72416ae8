"""A small 2-D U-Net for per-pixel (foreground) segmentation, split like every FedModel.

Shaped after the U-Net of the FedDG-ELCFS official code (``networks/unet2d.py``): conv
blocks of 3x3 conv + InstanceNorm (no affine parameters, so no running buffers) + ReLU, max
pooling down, nearest-neighbour 2x upsampling + 1x1 conv up, skip concatenation, and a 1x1
conv head. ``backbone`` is the whole encoder-decoder and returns the last decoder feature
map, the per-pixel embedding ELCFS's boundary-contrastive loss averages over boundary and
background regions; ``head`` maps it to one logit map per output channel.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fedshift.core.errors import ModelError

from .base import FedModel

__all__ = ["build_unet"]


def _conv_block(in_ch: int, out_ch: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_ch, out_ch, 3, padding=1),
        nn.InstanceNorm2d(out_ch),
        nn.ReLU(),
        nn.Conv2d(out_ch, out_ch, 3, padding=1),
        nn.InstanceNorm2d(out_ch),
        nn.ReLU(),
    )


class UNetBody(nn.Module):
    """Encoder-decoder with ``depth`` poolings; returns ``(N, width, H, W)`` features."""

    def __init__(self, in_channels: int, width: int, depth: int):
        super().__init__()
        widths = [width * 2**i for i in range(depth + 1)]
        self.down = nn.ModuleList(
            [_conv_block(in_channels, widths[0])]
            + [_conv_block(widths[i], widths[i + 1]) for i in range(depth)]
        )
        self.pool = nn.MaxPool2d(2)
        self.reduce = nn.ModuleList(
            [nn.Conv2d(widths[i + 1], widths[i], 1) for i in reversed(range(depth))]
        )
        self.up = nn.ModuleList(
            [_conv_block(2 * widths[i], widths[i]) for i in reversed(range(depth))]
        )

    def forward(self, x: Tensor) -> Tensor:
        skips = []
        for i, block in enumerate(self.down):
            x = block(x if i == 0 else self.pool(x))
            skips.append(x)
        x = skips.pop()
        for reduce, block in zip(self.reduce, self.up, strict=True):
            x = reduce(nn.functional.interpolate(x, scale_factor=2.0, mode="nearest"))
            x = block(torch.cat([skips.pop(), x], dim=1))
        return x


def build_unet(
    num_classes: int,
    *,
    in_channels: int = 3,
    image_size: int = 32,
    width: int = 16,
    depth: int = 3,
    out_channels: int = 1,
) -> FedModel:
    """A U-Net predicting ``out_channels`` logit maps (default 1: digit foreground).

    ``num_classes`` (the dataset's class count) is not used: segmentation predicts
    ``out_channels`` per-pixel logits, and the model records ``num_classes = out_channels``.
    ``image_size`` must be divisible by ``2**depth``. Options: ``width`` (channels of the
    first block; doubled at each level, default 16 as in the official code), ``depth``
    (number of poolings, default 3 for 32 px inputs), ``out_channels``.
    """
    for name, value in (("width", width), ("depth", depth), ("out_channels", out_channels)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ModelError(f"option {name!r} must be a positive int, got {value!r}")
    if int(in_channels) < 1:
        raise ModelError(f"in_channels must be >= 1, got {in_channels}")
    if image_size % (2**depth):
        raise ModelError(
            f"model 'unet' with depth {depth} needs image_size divisible by {2**depth}, "
            f"got {image_size}"
        )
    body = UNetBody(in_channels, width, depth)
    head = nn.Conv2d(width, out_channels, 1)
    return FedModel(body, head, embed_dim=width, num_classes=out_channels, arch="unet")
