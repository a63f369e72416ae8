"""The model contract: a backbone that yields flat features and a head that yields logits."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fedshift.core.errors import ModelError
from fedshift.core.runconfig import NORMALIZATIONS

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "MNIST_MEAN",
    "MNIST_STD",
    "NORMALIZATIONS",
    "FedModel",
    "GrayInput",
    "MeanStdInput",
    "normalize_input",
    "set_gray_input",
    "set_input_normalization",
]


#: ImageNet channel statistics (RGB, images in [0, 1]) of torchvision's pretrained weights
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: MNIST's pixel statistics (images in [0, 1]), as torchvision's MNIST examples and the
#: official FedProto code normalize (``Normalize((0.1307,), (0.3081,))``); one value for
#: every channel
MNIST_MEAN = (0.1307,)
MNIST_STD = (0.3081,)
#: each normalization besides ``symmetric`` -> the (mean, std) its hook applies to [0, 1] input
MEAN_STD: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "imagenet": (IMAGENET_MEAN, IMAGENET_STD),
    "mnist": (MNIST_MEAN, MNIST_STD),
}


class MeanStdInput:
    """A backbone forward pre-hook: fedshift's [-1, 1] input -> ``(x01 - mean) / std`` with
    ``x01 = (x + 1) / 2``, per channel (a one-value ``mean``/``std`` applies to every channel).

    Holds no tensors, so the model's ``state_dict`` and parameters are unchanged.
    """

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        self.mean, self.std = tuple(mean), tuple(std)

    def __call__(self, module: nn.Module, args: tuple) -> tuple:
        x, *rest = args
        shape = (1, -1) + (1,) * (x.dim() - 2)
        mean = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(shape)
        std = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(shape)
        return ((x + 1.0) * 0.5 - mean) / std, *rest


class GrayInput:
    """A backbone forward pre-hook: images ``(N, C, ...)`` -> one channel ``(N, 1, ...)``,
    the mean over the channels (exact for gray images stored as identical channels).

    Holds no tensors, so the model's ``state_dict`` and parameters are unchanged.
    """

    def __call__(self, module: nn.Module, args: tuple) -> tuple:
        x, *rest = args
        return x.mean(dim=1, keepdim=True), *rest


def set_input_normalization(model: FedModel, name: str) -> FedModel:
    """Make ``model``'s backbone expect ``name`` normalization (one of :data:`NORMALIZATIONS`:
    ``symmetric`` keeps the [-1, 1] input; the others re-normalize it with :data:`MEAN_STD`).

    A model's normalization is set once: asking again for the same one is a no-op, any other
    change after a non-symmetric one is a ``ModelError``."""
    if name not in NORMALIZATIONS:
        raise ModelError(
            f"unknown normalization {name!r}; choose one of: {', '.join(NORMALIZATIONS)}"
        )
    if model.input_normalization == name:
        return model
    if model.input_normalization != "symmetric":
        raise ModelError(
            f"a model's {model.input_normalization} input normalization cannot be changed"
        )
    if name != "symmetric":
        model.backbone.register_forward_pre_hook(MeanStdInput(*MEAN_STD[name]))
    model.input_normalization = name
    return model


def set_gray_input(model: FedModel) -> FedModel:
    """Make ``model``'s backbone take any number of channels and see their mean (one channel):
    for a backbone built with 1 input channel fed gray images stored as identical channels.
    The hook runs before any normalization hook (registered first whatever the order)."""
    if not model.gray_input:
        model.backbone.register_forward_pre_hook(GrayInput(), prepend=True)
        model.gray_input = True
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
        input_normalization: ``symmetric`` (the [-1, 1] input as is), ``imagenet`` (the
            backbone re-normalizes it with ImageNet's mean and std, as pretrained torchvision
            weights expect) or ``mnist`` (MNIST's mean and std on every channel); see
            :func:`set_input_normalization`.
        gray_input: the backbone averages its input's channels into one before anything
            else (built with 1 input channel; see :func:`set_gray_input`).
        weights_layout, weights_normalization: what the loaded weights were and expect.
        native_head, native_normalization: the architecture's own layout and normalization,
            for weight files written by torchvision or timm.
        cpu_channels_last: the preferred CPU memory format is channels_last.
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
        self.gray_input = False
        #: the layout of the loaded weights (fedshift, torchvision, timm, efficientnet-lite;
        #: None: no weights loaded), set by the loaders of ``fedshift.models.weights``
        self.weights_layout: str | None = None
        #: the input normalization the loaded weights expect (None: no pretrained weights)
        self.weights_normalization: str | None = None
        #: the classifier's name in the architecture's own state_dict layout (torchvision's
        #: ``fc``, AlexNet's ``classifier.6``, timm's ``classifier`` or ``head.fc``): a file in
        #: that layout maps it to ``head.`` and everything else to ``backbone.``
        self.native_head = "fc"
        #: the input normalization the architecture's own pretrained weights expect
        self.native_normalization = "imagenet"
        #: train in channels_last on the CPU when ``channels_last=auto`` (the model card's
        #: preferred CPU memory format; faster for depthwise convolutions)
        self.cpu_channels_last = False

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
