"""Reading pretrained weights into a FedModel (never downloads anything).

Every weight file, whatever its source and format (torch's zip or pickle, safetensors), is
read by :func:`read_state_file` under one guard: opened without blocking, refused unless it
is a regular file, parsed with ``torch.load(weights_only=True)`` or safetensors, and every
failure is one ``ModelError`` line. Where a file comes from, how it is checked and how its
names map onto fedshift's ``backbone.``/``head.`` layout is its weight source's business
(``fedshift.models.sources``); which file ``model_weights=imagenet`` means is the model's
card (``fedshift.models.cards``).
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

from torch import Tensor

from fedshift.core.errors import ModelError
from fedshift.core.torchload import load_failure, load_weights_only, plain_line

from .base import FedModel
from .cards import CARDS, card_of
from .sources import PinnedWeights, check_weight_file, weight_source

__all__ = [
    "IMAGENET",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "imagenet_weights_file",
    "load_imagenet",
    "load_pretrained",
    "load_state",
    "load_weights",
    "read_state_file",
    "weights_file",
]

#: the ``model_weights`` value that asks for the model card's pinned (ImageNet) weights
IMAGENET = "imagenet"
#: torchvision's ImageNet normalization (every ``IMAGENET1K`` weight set uses it)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_PREFIXES = ("backbone.", "head.")
_WRAPPER_KEYS = ("state_dict", "model_state_dict", "model")
_SHOW = 5  # how many offending keys an error message lists
_SAFETENSORS = ".safetensors"


def _open_regular(path: str) -> io.BufferedReader:
    """``path`` opened for reading without ever blocking (a FIFO with no writer would hang a
    plain ``open``), refused unless it is a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ModelError(f"weights file not found: {path!r}") from None
    except OSError as exc:
        raise ModelError(f"cannot open weights file {path!r}: {exc.strerror}") from None
    try:
        check_weight_file(path, os.fstat(fd).st_mode)
    except ModelError:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _parse(handle: io.BufferedReader, path: str) -> object:
    """The object a weight file holds: safetensors by its suffix, else ``torch.load``."""
    if path.endswith(_SAFETENSORS):
        from safetensors.torch import load as load_safetensors

        return load_safetensors(handle.read())
    return load_weights_only(handle)


def read_state_file(path: str | os.PathLike) -> dict[str, Tensor]:
    """The tensor state_dict in the weight file ``path``, whatever its format.

    A wrapping checkpoint (``{"state_dict": ..., "epoch": 3}``) is unwrapped and a
    DataParallel ``module.`` prefix dropped.

    Raises:
        ModelError: a missing path, one that is no regular file (a folder, a FIFO,
            ``/dev/zero``), an unreadable or corrupt file, one holding no state_dict, or
            complex-valued tensors; always one line.
    """
    path = os.fspath(path)
    with _open_regular(path) as handle:
        try:
            obj = _parse(handle, path)
        except Exception as exc:  # corrupt file, disallowed pickle globals, bad header, ...
            raise ModelError(
                f"could not read weights file {path!r} as a tensor state_dict "
                f"({_format_of(path)} failed: {load_failure(exc)})"
            ) from None
    if isinstance(obj, Mapping) and not all(isinstance(v, Tensor) for v in obj.values()):
        # a checkpoint that wraps the state_dict, e.g. {"state_dict": {...}, "epoch": 3}
        for key in _WRAPPER_KEYS:
            if isinstance(obj.get(key), Mapping):
                obj = obj[key]
                break
    if (
        not isinstance(obj, Mapping)
        or not obj
        or not all(isinstance(k, str) and isinstance(v, Tensor) for k, v in obj.items())
    ):
        raise ModelError(
            f"weights file {path!r} does not hold a state_dict: expected a non-empty dict "
            f"mapping parameter names to tensors, got {type(obj).__name__}"
        )
    complex_keys = [k for k, v in obj.items() if v.is_complex()]
    if complex_keys:
        raise ModelError(
            f"weights file {path!r} holds complex-valued tensors "
            f"({_listing([plain_line(k, 80) for k in complex_keys])}); a model's weights are real"
        )
    state = dict(obj)
    if all(k.startswith("module.") for k in state):  # saved from nn.DataParallel
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


def _format_of(path: str) -> str:
    if path.endswith(_SAFETENSORS):
        return "safetensors.torch.load"
    return "torch.load(weights_only=True)"


def _listing(keys: list[str]) -> str:
    shown = ", ".join(keys[:_SHOW])
    return shown + (f", ... ({len(keys)} in all)" if len(keys) > _SHOW else "")


def load_weights(model: FedModel, path: str | os.PathLike) -> FedModel:
    """Load a local ``state_dict`` file into ``model`` in place and return it.

    Accepted layouts:

    * a fedshift state_dict (keys start with ``backbone.`` / ``head.``), as written by
      ``torch.save(model.state_dict(), path)``;
    * a plain torchvision ResNet state_dict (``conv1.*``, ``bn1.*``, ``layer*.*``, ``fc.*``),
      for the ``resnet18`` / ``resnet50`` models: ``fc.*`` becomes ``head.*`` and everything
      else ``backbone.*``.

    Either may be wrapped in a dict under ``"state_dict"`` / ``"model_state_dict"`` / ``"model"``
    and may carry a DataParallel ``module.`` prefix.

    The backbone must match exactly (same keys, same shapes). The head is loaded only when all
    its keys are present with matching shapes; otherwise (e.g. an ImageNet ``fc`` with 1000
    classes) it keeps its fresh initialization and a ``UserWarning`` says so.

    Raises:
        ModelError: missing file, unreadable file, not a state_dict, or backbone keys/shapes
            that do not fit the model (the message lists what was expected).
    """
    return load_pretrained(model, PinnedWeights("file", os.fspath(path)))


def load_pretrained(model: FedModel, pin: PinnedWeights, name: str | None = None) -> FedModel:
    """Load the weights ``pin`` names into ``model`` in place and return it: its source finds
    and checks the file, :func:`read_state_file` reads it, the source maps it onto fedshift's
    layout, and :func:`load_state` loads it. Sets ``weights_layout`` and
    ``weights_normalization`` (the input normalization the weights expect)."""
    source = weight_source(pin.source)
    path = source.locate(name or model.arch, pin)
    state, layout = source.to_fedshift(read_state_file(path), model, pin)
    label = "torchvision-style (mapped to backbone./head.)" if layout == "torchvision" else layout
    load_state(model, state, source=f"weights file {os.fspath(path)!r}", layout=label)
    model.weights_layout = layout
    model.weights_normalization = source.normalization(model, layout)
    return model


def load_state(model: FedModel, state: dict[str, Tensor], *, source: str, layout: str) -> None:
    """Load a state_dict already in fedshift's layout (``backbone.``/``head.``) into ``model``:
    the backbone must match exactly, the head is loaded only when it fits (see
    :func:`load_weights`); ``source`` and ``layout`` name the weights in messages."""
    name = model.arch or type(model).__name__

    expected = model.state_dict()
    missing = [k for k in expected if k.startswith("backbone.") and k not in state]
    unexpected = [k for k in state if k not in expected]
    wrong_shape = [
        f"{k} (file {tuple(state[k].shape)}, model {tuple(expected[k].shape)})"
        for k in expected
        if k.startswith("backbone.") and k in state and state[k].shape != expected[k].shape
    ]
    if missing or unexpected or wrong_shape:
        parts = []
        if missing:
            parts.append(f"missing keys: {_listing(missing)}")
        if unexpected:
            parts.append(f"unexpected keys: {_listing(unexpected)}")
        if wrong_shape:
            parts.append(f"shape mismatches: {_listing(wrong_shape)}")
        hint = (
            ""
            if not layout.startswith("torchvision")
            else "; a torchvision-style state_dict only fits 'resnet18'/'resnet50'/'alexnet' "
            "built with the same options (small_input, in_channels) as the saved network"
        )
        raise ModelError(
            f"{source} ({layout}) does not fit model {name!r}: "
            + "; ".join(parts)
            + f". Expected keys like {_listing(list(expected))}"
            + hint
        )

    head_keys = [k for k in expected if k.startswith("head.")]
    head_ok = all(k in state and state[k].shape == expected[k].shape for k in head_keys)
    merged = dict(expected)
    for k in expected:
        if k.startswith("backbone.") or head_ok:
            merged[k] = state[k]
    if not head_ok:
        found = {k: tuple(state[k].shape) for k in head_keys if k in state}
        warnings.warn(
            f"{source}: head not loaded into model {name!r} "
            f"(num_classes={model.num_classes}); file has {found or 'no head'}, model expects "
            f"{ {k: tuple(expected[k].shape) for k in head_keys} }. "
            "The head keeps its fresh initialization.",
            UserWarning,
            stacklevel=3,
        )
    model.load_state_dict(merged, strict=True)


def _pinned(name: str) -> PinnedWeights:
    card = card_of(name)
    if card is None or card.weights is None:
        pinned = [n for n, c in CARDS.items() if c.weights is not None]
        raise ModelError(
            f"model_weights=imagenet: no ImageNet weights for model {name!r}; "
            f"available for {', '.join(pinned)} and timm:NAME"
        )
    return card.weights


def imagenet_weights_file(name: str) -> Path:
    """The pinned (ImageNet) weight file of model ``name`` on this machine, checked by its
    source (torchvision's hash in the file name, the package's sha256, ...).

    Raises:
        ModelError: the model pins no weights, the file is absent (the message says which
            file to put where), or it differs from the pinned one.
    """
    pin = _pinned(name)
    return weight_source(pin.source).locate(name, pin)


def load_imagenet(model: FedModel, name: str) -> FedModel:
    """Load model ``name``'s pinned ImageNet weights into ``model`` in place (never
    downloads); sets the input normalization those weights expect."""
    return load_pretrained(model, _pinned(name), name)


def weights_file(name: str, model_weights: str | os.PathLike) -> Path:
    """The file ``model_weights`` names for model ``name``: ``imagenet`` is the card's
    pinned file (:func:`imagenet_weights_file`), anything else a path to a regular file. A
    run calls it before loading its dataset, so a missing weight file is reported before a
    single image is decoded.

    Raises:
        ModelError: as :func:`imagenet_weights_file`, or the path is no regular file.
    """
    if os.fspath(model_weights) == IMAGENET:
        return imagenet_weights_file(name)
    return check_weight_file(model_weights)
