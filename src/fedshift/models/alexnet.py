"""torchvision AlexNet split into a backbone (up to fc7, 4096 features) and a linear head.

FedADG (Zhang et al., 2021) trains AlexNet on PACS, as the DG literature before it did. Built
with ``weights=None``; ImageNet weights come from a local file (``model_weights=imagenet`` or a
path). The backbone keeps torchvision's child names (``features``, ``avgpool``, ``classifier``
without its last layer), so a torchvision AlexNet ``state_dict`` maps onto it by prefixing
``backbone.`` and renaming ``classifier.6.`` (fc8) to ``head.``.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from fedshift.core.errors import ModelError

from .base import FedModel

__all__ = ["build_alexnet", "MIN_IMAGE_SIZE"]

#: the smallest input whose feature map survives AlexNet's three stride-2 max-pools
MIN_IMAGE_SIZE = 63
EMBED_DIM = 4096


def build_alexnet(
    num_classes: int, *, in_channels: int = 3, image_size: int = 224, dropout: float = 0.5
) -> FedModel:
    """AlexNet (Krizhevsky et al., NeurIPS 2012) from torchvision, randomly initialized.

    Options:
        dropout: dropout before fc6 and fc7 (torchvision's and the original 0.5).

    ``in_channels != 3`` replaces ``conv1`` (same shape otherwise); images must be at least
    63 px (224 is the usual size; the adaptive pooling makes any larger size work).
    """
    if int(num_classes) < 1:
        raise ModelError(f"num_classes must be >= 1, got {num_classes}")
    if int(image_size) < MIN_IMAGE_SIZE:
        raise ModelError(
            f"alexnet needs images of at least {MIN_IMAGE_SIZE} px, got {image_size} "
            "(use --set image_size=224, or a smaller model such as cnn)"
        )
    if not 0 <= float(dropout) < 1:
        raise ModelError(f"option 'dropout' must be in [0, 1), got {dropout!r}")
    from torchvision import models as tvm

    net = tvm.alexnet(weights=None, num_classes=num_classes, dropout=float(dropout))
    if in_channels != 3:
        net.features[0] = nn.Conv2d(in_channels, 64, kernel_size=11, stride=4, padding=2)
    backbone = nn.Sequential(
        OrderedDict(
            features=net.features,
            avgpool=net.avgpool,
            flatten=nn.Flatten(),
            classifier=nn.Sequential(*list(net.classifier.children())[:6]),
        )
    )
    head = net.classifier[6]
    model = FedModel(backbone, head, embed_dim=EMBED_DIM, num_classes=num_classes, arch="alexnet")
    model.native_head = "classifier.6"  # torchvision's last layer, fedshift's head
    return model
