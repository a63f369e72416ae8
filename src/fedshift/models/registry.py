"""Model registry: names, descriptions and ``build_model``."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from functools import partial

from .base import FedModel
from .cnn import build_cnn, build_digit5_cnn, build_fedproto_cnn
from .resnet import build_resnet
from .weights import load_weights

__all__ = ["DEFAULT_MODEL", "MODELS", "build_model"]

DEFAULT_MODEL = "cnn"

MODELS: dict[str, str] = {
    "cnn": (
        "fedshift's small 3-block conv-BN CNN for 28-64 px (default; fast on CPU), embed_dim 256"
    ),
    "digit5-cnn": (
        "Digit-Five CNN of M3SDA (Peng et al., ICCV 2019) as used by KD3A (Feng et al., "
        "ICML 2021) and FACT; 32 px, embed_dim 2048"
    ),
    "fedproto-cnn": (
        "MNIST CNN of FedAvg (McMahan et al., AISTATS 2017) as CNNMnist in FedProto "
        "(Tan et al., AAAI 2022); 28/32 px, embed_dim 50"
    ),
    "resnet18": "ResNet-18 (He et al., CVPR 2016), torchvision, weights=None; embed_dim 512",
    "resnet50": "ResNet-50 (He et al., CVPR 2016), torchvision, weights=None; embed_dim 2048",
}

_BUILDERS: dict[str, Callable[..., FedModel]] = {
    "cnn": build_cnn,
    "digit5-cnn": build_digit5_cnn,
    "fedproto-cnn": build_fedproto_cnn,
    "resnet18": partial(build_resnet, "resnet18"),
    "resnet50": partial(build_resnet, "resnet50"),
}

_COMMON = {"num_classes", "in_channels", "image_size"}


def _options_of(name: str) -> list[str]:
    fn = _BUILDERS[name]
    params = inspect.signature(fn).parameters
    return [p for p, v in params.items() if v.kind is v.KEYWORD_ONLY and p not in _COMMON]


def build_model(
    name: str,
    num_classes: int,
    *,
    in_channels: int = 3,
    image_size: int = 32,
    weights_path: str | os.PathLike | None = None,
    **options,
) -> FedModel:
    """Build a registered model; parameters get torch's default init under the global RNG.

    Args:
        name: a key of ``MODELS``.
        num_classes: number of logits.
        in_channels: image channels (1 for grayscale digits, 3 for RGB).
        image_size: side of the (square) input images; fixes flatten sizes of the CNNs.
        weights_path: optional local ``state_dict`` file to load (see
            ``fedshift.models.weights.load_weights``); never downloads.
        **options: model-specific options (see each builder's docstring); unknown options
            raise ``ValueError``.

    Raises:
        ValueError: unknown name, unknown or invalid option, or weights that do not fit.
    """
    if name not in _BUILDERS:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    allowed = _options_of(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for model {name!r}; "
            f"accepted options: {', '.join(allowed) or '(none)'}"
        )
    model = _BUILDERS[name](num_classes, in_channels=in_channels, image_size=image_size, **options)
    if weights_path is not None:
        load_weights(model, weights_path)
    return model
