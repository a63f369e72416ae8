"""Small convolutional backbones for 28-64 px images (digits, CIFAR-sized domains).

Flatten sizes are computed arithmetically from ``image_size`` rather than with a dummy forward
pass, so building a model never touches BatchNorm running statistics or the dropout RNG: the
only randomness is the default parameter initialization under the caller's global seed.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from fedshift.core.errors import ModelError

from .base import FedModel

__all__ = ["build_cnn", "build_digit5_cnn", "build_fact_cnn", "build_fedproto_cnn"]


def _check_common(num_classes: int, in_channels: int, image_size: int) -> None:
    if int(num_classes) < 1:
        raise ModelError(f"num_classes must be >= 1, got {num_classes}")
    if int(in_channels) < 1:
        raise ModelError(f"in_channels must be >= 1, got {in_channels}")
    if int(image_size) < 1:
        raise ModelError(f"image_size must be >= 1, got {image_size}")


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelError(f"option {name!r} must be a positive int, got {value!r}")
    return value


def _probability(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value < 1.0:
        raise ModelError(f"option {name!r} must be a float in [0, 1), got {value!r}")
    return float(value)


def _conv_pool_block(index: int, c_in: int, c_out: int) -> dict[str, nn.Module]:
    """The Digit-Five block ``conv{i}`` 5x5 (padding 2) -> BN -> ReLU -> MaxPool(3, 2, 1)."""
    return {
        f"conv{index}": nn.Conv2d(c_in, c_out, 5, stride=1, padding=2),
        f"bn{index}": nn.BatchNorm2d(c_out),
        f"relu{index}": nn.ReLU(),
        f"pool{index}": nn.MaxPool2d(3, stride=2, padding=1),
    }


def _side_after_pools(image_size: int, pools: int = 2) -> int:
    """Spatial side after ``pools`` MaxPool2d(kernel 3, stride 2, padding 1) layers."""
    side = image_size
    for _ in range(pools):
        side = (side + 2 * 1 - 3) // 2 + 1
    return side


def build_cnn(
    num_classes: int,
    *,
    in_channels: int = 3,
    image_size: int = 32,
    embed_dim: int = 256,
    width: float = 1.0,
) -> FedModel:
    """The default small CNN (fedshift's own; fast on CPU at 32x32).

    Three blocks ``conv-BN-ReLU-maxpool2`` with 32/64/128 channels (kernel 5, 5, 3; "same"
    padding), flatten, ``Linear -> BatchNorm1d -> ReLU`` to ``embed_dim`` features; head
    ``Linear(embed_dim, num_classes)``.

    Options:
        embed_dim: feature size (default 256).
        width: channel multiplier for the three conv blocks (default 1.0; channels are
            ``max(1, round(c * width))``).

    Works for any ``image_size >= 8`` (28, 32, 64, ...): the spatial size after the three pools
    is ``image_size // 8`` (floor at each pool).
    """
    _check_common(num_classes, in_channels, image_size)
    embed_dim = _positive_int("embed_dim", embed_dim)
    if isinstance(width, bool) or not isinstance(width, int | float) or width <= 0:
        raise ModelError(f"option 'width' must be a positive number, got {width!r}")
    c1, c2, c3 = (max(1, round(c * width)) for c in (32, 64, 128))
    side = image_size // 2 // 2 // 2
    if side < 1:
        raise ModelError(f"model 'cnn' needs image_size >= 8, got {image_size}")
    backbone = nn.Sequential(
        OrderedDict(
            conv1=nn.Conv2d(in_channels, c1, 5, padding=2),
            bn1=nn.BatchNorm2d(c1),
            relu1=nn.ReLU(),
            pool1=nn.MaxPool2d(2),
            conv2=nn.Conv2d(c1, c2, 5, padding=2),
            bn2=nn.BatchNorm2d(c2),
            relu2=nn.ReLU(),
            pool2=nn.MaxPool2d(2),
            conv3=nn.Conv2d(c2, c3, 3, padding=1),
            bn3=nn.BatchNorm2d(c3),
            relu3=nn.ReLU(),
            pool3=nn.MaxPool2d(2),
            flatten=nn.Flatten(),
            fc=nn.Linear(c3 * side * side, embed_dim),
            bn_fc=nn.BatchNorm1d(embed_dim),
            relu_fc=nn.ReLU(),
        )
    )
    head = nn.Linear(embed_dim, num_classes)
    return FedModel(backbone, head, embed_dim=embed_dim, num_classes=num_classes, arch="cnn")


def build_digit5_cnn(
    num_classes: int,
    *,
    in_channels: int = 3,
    image_size: int = 32,
    dropout: float = 0.5,
) -> FedModel:
    """The Digit-Five CNN of M3SDA / KD3A (and FADA's digit experiments).

    FACT's official code splits a Digit-Five network differently (two conv blocks as the
    generator, a three-layer MLP as each head): that model is ``fact-cnn``
    (:func:`build_fact_cnn`); with ``digit5-cnn`` FACT's generator is this whole backbone and
    its heads are single linear layers.

    Layer sizes follow the KD3A official code (``model/digit5.py``), itself taken from M3SDA:

    * ``conv1`` 5x5, 64 ch, padding 2 -> BN -> ReLU -> MaxPool(3, stride 2, padding 1)
    * ``conv2`` 5x5, 64 ch, padding 2 -> BN -> ReLU -> MaxPool(3, stride 2, padding 1)
    * ``conv3`` 5x5, 128 ch, padding 2 -> BN -> ReLU
    * flatten (128 * 8 * 8 = 8192 at 32x32) -> ``fc1`` 3072 -> BN1d -> ReLU -> Dropout(0.5)
    * ``fc2`` 2048 -> BN1d -> ReLU  => features, ``embed_dim = 2048``
    * head: ``Linear(2048, num_classes)``

    Note: the convs are padded (padding 2) and the pools are 3x3 with stride 2 and padding 1;
    that is what makes the flatten size 8192 at 32x32 (unpadded 5x5 convs with 2x2 pools would
    give 128 * 1 * 1). Designed for 32x32; other sizes >= 1 work, with flatten size
    ``128 * s * s`` where ``s = ceil(ceil(image_size / 2) / 2)``.

    Options:
        dropout: dropout probability after ``fc1`` (default 0.5, as in the original).
    """
    _check_common(num_classes, in_channels, image_size)
    dropout = _probability("dropout", dropout)
    side = _side_after_pools(image_size)
    embed_dim = 2048
    backbone = nn.Sequential(
        OrderedDict(
            **_conv_pool_block(1, in_channels, 64),
            **_conv_pool_block(2, 64, 64),
            conv3=nn.Conv2d(64, 128, 5, stride=1, padding=2),
            bn3=nn.BatchNorm2d(128),
            relu3=nn.ReLU(),
            flatten=nn.Flatten(),
            fc1=nn.Linear(128 * side * side, 3072),
            bn4=nn.BatchNorm1d(3072),
            relu4=nn.ReLU(),
            dropout=nn.Dropout(dropout),
            fc2=nn.Linear(3072, embed_dim),
            bn5=nn.BatchNorm1d(embed_dim),
            relu5=nn.ReLU(),
        )
    )
    head = nn.Linear(embed_dim, num_classes)
    return FedModel(backbone, head, embed_dim=embed_dim, num_classes=num_classes, arch="digit5-cnn")


def build_fact_cnn(
    num_classes: int,
    *,
    in_channels: int = 3,
    image_size: int = 32,
    dropout: float = 0.5,
) -> FedModel:
    """FACT's Digit-Five model (Schrod et al., 2023; official ``models/digit_model.py``):
    the generator G is the backbone, each classifier head F the three-layer MLP.

    * backbone (G): ``conv1`` 5x5, 64 ch, padding 2 -> BN -> ReLU -> MaxPool(3, 2, padding 1);
      ``conv2`` 5x5, 128 ch, padding 2 -> BN -> ReLU -> MaxPool(3, 2, padding 1); flatten
      (128 * 8 * 8 = 8192 at 32x32) => features, ``embed_dim = 128 * s * s``
    * head (F): Dropout -> ``fc1`` 3072 -> BN1d -> ReLU -> Dropout -> ``fc2`` 100 -> BN1d ->
      ReLU -> Dropout -> ``fc3`` ``num_classes``

    Deviation note: the official head ends in a Softmax and FACT's losses take its
    probabilities; here the head returns logits and FACT applies softmax where the official
    code's losses see probabilities (see :mod:`fedshift.algorithms.fact`). The official head
    also defines a ``BatchNorm1d`` after ``fc3`` that its forward never uses; it is left out.

    Options:
        dropout: probability of the three dropouts (default 0.5, as in the original).
    """
    _check_common(num_classes, in_channels, image_size)
    dropout = _probability("dropout", dropout)
    side = _side_after_pools(image_size)
    embed_dim = 128 * side * side
    backbone = nn.Sequential(
        OrderedDict(
            **_conv_pool_block(1, in_channels, 64),
            **_conv_pool_block(2, 64, 128),
            flatten=nn.Flatten(),
        )
    )
    head = nn.Sequential(
        OrderedDict(
            drop1=nn.Dropout(dropout),
            fc1=nn.Linear(embed_dim, 3072),
            bn1=nn.BatchNorm1d(3072),
            relu1=nn.ReLU(),
            drop2=nn.Dropout(dropout),
            fc2=nn.Linear(3072, 100),
            bn2=nn.BatchNorm1d(100),
            relu2=nn.ReLU(),
            drop3=nn.Dropout(dropout),
            fc3=nn.Linear(100, num_classes),
        )
    )
    return FedModel(backbone, head, embed_dim=embed_dim, num_classes=num_classes, arch="fact-cnn")


def build_fedproto_cnn(
    num_classes: int,
    *,
    in_channels: int = 3,
    image_size: int = 32,
    out_channels: tuple[int, int] | list[int] = (10, 20),
    embed_dim: int = 50,
    dropout: float = 0.5,
) -> FedModel:
    """The MNIST CNN of the FedAvg paper as used by FedProto (``CNNMnist`` in its official code).

    * ``conv1`` 5x5 (no padding), ``out_channels[0]`` ch -> MaxPool(2) -> ReLU
    * ``conv2`` 5x5, ``out_channels[1]`` ch -> Dropout2d(0.5) -> MaxPool(2) -> ReLU
    * flatten (20 * 4 * 4 = 320 at 28x28; 20 * 5 * 5 = 500 at 32x32) -> ``fc1`` -> ReLU
      => features, ``embed_dim = 50``
    * head: ``Sequential(Dropout(0.5), Linear(50, num_classes))``

    As in the official code, the prototype / feature vector is the ReLU output *before* the
    dropout, so the dropout lives at the start of the head (keys ``head.1.weight`` /
    ``head.1.bias``), not in the backbone.

    FedProto's model heterogeneity gives clients different ``out_channels`` while keeping the
    embedding size common; the official code varies the second conv's channels (its
    ``args.out_channels``), i.e. ``out_channels=(10, c)`` here.

    Options:
        out_channels: channels of ``(conv1, conv2)``, default ``(10, 20)``.
        embed_dim: feature size (default 50).
        dropout: probability of both the Dropout2d after ``conv2`` and the head dropout
            (default 0.5, PyTorch's default as in the original).

    Needs ``image_size >= 16``; 28 and 32 are the intended sizes.
    """
    _check_common(num_classes, in_channels, image_size)
    if (
        not isinstance(out_channels, tuple | list)
        or len(out_channels) != 2
        or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in out_channels)
    ):
        raise ModelError(
            f"option 'out_channels' must be a pair of positive ints, got {out_channels!r}"
        )
    c1, c2 = out_channels
    embed_dim = _positive_int("embed_dim", embed_dim)
    dropout = _probability("dropout", dropout)
    side = ((image_size - 4) // 2 - 4) // 2
    if image_size < 16 or side < 1:
        raise ModelError(f"model 'fedproto-cnn' needs image_size >= 16, got {image_size}")
    backbone = nn.Sequential(
        OrderedDict(
            conv1=nn.Conv2d(in_channels, c1, 5),
            pool1=nn.MaxPool2d(2),
            relu1=nn.ReLU(),
            conv2=nn.Conv2d(c1, c2, 5),
            conv2_drop=nn.Dropout2d(dropout),
            pool2=nn.MaxPool2d(2),
            relu2=nn.ReLU(),
            flatten=nn.Flatten(),
            fc1=nn.Linear(c2 * side * side, embed_dim),
            relu3=nn.ReLU(),
        )
    )
    head = nn.Sequential(nn.Dropout(dropout), nn.Linear(embed_dim, num_classes))
    return FedModel(
        backbone, head, embed_dim=embed_dim, num_classes=num_classes, arch="fedproto-cnn"
    )
