"""The model contract: a backbone that yields flat features and a head that yields logits."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fedshift.core.errors import ModelError
from fedshift.core.runconfig import NORMALIZATIONS

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "NORMALIZATIONS",
    "FedModel",
    "normalize_input",
    "set_input_normalization",
]


#: ImageNet channel statistics (RGB, images in [0, 1]) of torchvision's pretrained weights
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ImageNetInput:
    """A backbone forward pre-hook: fedshift's [-1, 1] input -> ImageNet-normalized input.

    Holds no tensors, so the model's ``state_dict`` and parameters are unchanged.
    """

    def __call__(self, module: nn.Module, args: tuple) -> tuple:
        x, *rest = args
        shape = (1, -1) + (1,) * (x.dim() - 2)
        mean = torch.tensor(IMAGENET_MEAN, dtype=x.dtype, device=x.device).view(shape)
        std = torch.tensor(IMAGENET_STD, dtype=x.dtype, device=x.device).view(shape)
        return ((x + 1.0) * 0.5 - mean) / std, *rest


def set_input_normalization(model: FedModel, name: str) -> FedModel:
    """Make ``model``'s backbone expect ``name`` normalization (``symmetric`` or ``imagenet``)."""
    if name not in NORMALIZATIONS:
        raise ModelError(
            f"unknown normalization {name!r}; choose one of: {', '.join(NORMALIZATIONS)}"
        )
    if name == "imagenet":
        if model.input_normalization == "imagenet":
            return model
        model.backbone.register_forward_pre_hook(ImageNetInput())
    elif model.input_normalization == "imagenet":
        raise ModelError("a model's ImageNet input normalization cannot be removed")
    model.input_normalization = name
    return model


class FedModel(nn.Module):
    """Backbone with an explicit features/classifier split.

    The feature extractor lives under ``self.backbone`` and the classifier under ``self.head``,
    so every ``state_dict`` key starts with ``"backbone."`` or ``"head."``. Algorithms that treat
    the two parts differently (FACT's G and F, PerAda's adapters, FedRep/FedBABU-style
    personalization) split parameters on those prefixes.

    Attributes:
        backbone: maps images ``(N, C, H, W)`` to flat features ``(N, embed_dim)``.
        head: maps features to logits ``(N, num_classes)``; an ``nn.Linear`` or an
            ``nn.Sequential`` (see the individual model for which).
        embed_dim: size of the feature vector.
        num_classes: number of output logits.
        arch: the registry name the model was built from (informational).
        input_normalization: ``symmetric`` (the [-1, 1] input as is) or ``imagenet`` (the
            backbone re-normalizes it with ImageNet's mean and std, as pretrained torchvision
            weights expect); see :func:`set_input_normalization`.
    """

    def __init__(
        self,
        backbone: nn.Module,
        head: nn.Module,
        *,
        embed_dim: int,
        num_classes: int,
        arch: str = "",
    ) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.embed_dim = int(embed_dim)
        self.num_classes = int(num_classes)
        self.arch = arch
        self.input_normalization = "symmetric"
        self.weights_layout: str | None = None  # set by load_weights: fedshift / torchvision
        #: the input normalization the loaded weights expect (None: no pretrained weights)
        self.weights_normalization: str | None = None

    def features(self, x: Tensor) -> Tensor:
        """Images ``(N, C, H, W)`` -> flat features ``(N, embed_dim)``."""
        return self.backbone(x)

    def classifier(self, f: Tensor) -> Tensor:
        """Features ``(N, embed_dim)`` -> logits ``(N, num_classes)``."""
        return self.head(f)

    def forward(self, x: Tensor) -> Tensor:
        return self.classifier(self.features(x))

    def extra_repr(self) -> str:
        return f"arch={self.arch!r}, embed_dim={self.embed_dim}, num_classes={self.num_classes}"


def normalize_input(x_uint8: Tensor) -> Tensor:
    """Map uint8 images in ``[0, 255]`` to float32 in ``[-1, 1]``: ``(x / 255 - 0.5) / 0.5``.

    Works on any shape (typically ``(N, C, H, W)``); the result is on the input's device.
    """
    if not isinstance(x_uint8, Tensor):
        raise TypeError(f"normalize_input expects a torch.Tensor, got {type(x_uint8).__name__}")
    if x_uint8.dtype != torch.uint8:
        raise ModelError(
            f"normalize_input expects a uint8 tensor with values in [0, 255], got {x_uint8.dtype}"
        )
    return (x_uint8.to(torch.float32) / 255.0 - 0.5) / 0.5
