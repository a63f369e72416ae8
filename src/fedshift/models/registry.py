"""Model registry: ``register_model``, ``build_model`` and finding a model by name.

A name is a built-in card (``fedshift.models.cards``), one added by :func:`register_model`,
``timm:NAME``, a plug-in (entry point of group ``fedshift.models``) or an import path
``package.module:builder``. A builder is called as
``builder(num_classes, *, in_channels, image_size, **options)`` and returns a
:class:`~fedshift.models.base.FedModel`.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from fedshift.core.errors import ConfigError, ModelError
from fedshift.plugins import (
    is_import_path,
    load_import_path,
    load_plugin,
    plugin_names,
    plugin_source,
)

from .cards import BUILTIN_MODELS, CARDS, ModelCard, card_of, descriptions

if TYPE_CHECKING:  # building imports torch; naming and listing models does not
    from .base import FedModel

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "MODELS",
    "build_model",
    "find_card",
    "is_segmentation",
    "register_model",
    "segmentation_models",
]

log = logging.getLogger(__name__)

DEFAULT_MODEL = "cnn"

#: name -> one-line description of the built-in and registered models (a live view of the
#: cards, ``fedshift.models.cards.CARDS``)
MODELS = descriptions

#: the cards of the plug-ins and import paths found so far
_FOUND: dict[str, ModelCard] = {}

_COMMON = {"num_classes", "in_channels", "image_size"}


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
    if name in CARDS and CARDS[name].builder is not builder and not replace:
        raise ConfigError(f"model {name!r} is registered already; pass replace=True")
    CARDS[name] = ModelCard(
        name,
        builder,
        description or (builder.__doc__ or "").strip().split("\n")[0],
        problem="segmentation" if segmentation else "classification",
        origin="registered",
    )
    return builder


def find_card(name: str) -> ModelCard | None:
    """The card of model ``name``: built-in, registered, ``timm:NAME``, plug-in or
    ``module:builder`` (the last two get a card without pinned weights); else None."""
    card = card_of(name) or _FOUND.get(name)
    if card is not None:
        return card
    if is_import_path(name):
        builder = load_import_path(name, "model")
        origin = "import path"
    else:
        builder = load_plugin("model", name)
        if builder is None:
            return None
        origin = f"plug-in {plugin_source('model', name)}"
    if not callable(builder):
        raise ConfigError(f"model {name!r} is {builder!r}, not a callable model builder")
    description = (getattr(builder, "__doc__", None) or "").strip().split("\n")[0]
    _FOUND[name] = ModelCard(name, builder, description, origin=origin)
    return _FOUND[name]


def find_builder(name: str) -> Callable[..., FedModel] | None:
    """The builder of model ``name`` (see :func:`find_card`); else None."""
    card = find_card(name)
    return None if card is None else card.builder


def is_segmentation(name: str) -> bool:
    """Whether model ``name`` outputs per-pixel logit maps (``problem=segmentation``); False
    for a name without a card."""
    card = card_of(name)
    return card is not None and card.problem == "segmentation"


def segmentation_models() -> list[str]:
    """The built-in and registered models that segment (``problem=segmentation``)."""
    return [name for name, card in CARDS.items() if card.problem == "segmentation"]


def all_models() -> dict[str, ModelCard]:
    """Name -> card of the built-in, registered and plug-in models (a broken plug-in is a
    one-line warning and left out)."""
    out = dict(CARDS)
    for name in plugin_names("model"):
        if name in out:
            continue
        try:
            card = find_card(name)
        except ConfigError as exc:
            log.warning("%s", exc)
            continue
        if card is not None:
            out[name] = card
    return out


def _options_of(fn: Callable[..., FedModel]) -> list[str]:
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
            ``fedshift.models.weights.load_weights``), or ``"imagenet"`` for the weights the
            model's card pins (torchvision's file in torch's cache, a registry package's file,
            timm's file in the Hugging Face cache); never downloads.
        normalize: the input normalization the backbone expects: ``symmetric`` (fedshift's
            [-1, 1]), ``imagenet`` (ImageNet mean/std, for ImageNet-pretrained weights), or
            ``auto``: what the loaded weights expect (their source says: ``imagenet`` for
            torchvision's and most of timm's, ``symmetric`` for EfficientNet-Lite's), else
            ``symmetric``. The run key
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
    from .base import NORMALIZATIONS, FedModel, set_gray_input, set_input_normalization
    from .weights import IMAGENET, load_imagenet, load_weights

    card = find_card(name)
    if card is None:
        raise ModelError(
            f"unknown model {name!r}; choose one of: {', '.join(MODELS)} "
            "(or a plug-in as package.module:builder)"
        )
    builder = card.builder
    allowed = _options_of(builder)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ModelError(
            f"unknown option(s) {', '.join(map(repr, unknown))} for model {name!r}; "
            f"accepted options: {', '.join(allowed) or '(none)'}"
        )
    channels = 1 if gray_input else in_channels
    check_builder_signature(name, builder, num_classes, channels, image_size, options)
    model = builder(num_classes, in_channels=channels, image_size=image_size, **options)
    if not isinstance(model, FedModel):
        raise ModelError(
            f"model {name!r} built a {type(model).__name__}, not a fedshift.models.FedModel "
            "(a backbone giving flat features and a head giving logits)"
        )
    if card.cpu_memory_format == "channels_last":
        model.cpu_channels_last = True
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
