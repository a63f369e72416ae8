"""torchvision's ResNets (18 to 152) as a backbone (up to global pooling) and a linear head.

Always built with ``weights=None``: nothing is ever downloaded. Pretrained weights come from a
local file through ``build_model(..., weights_path=...)``.

The backbone is an ``nn.Sequential`` whose children keep torchvision's names (``conv1``, ``bn1``,
``layer1`` ... ``layer4``), so a torchvision ResNet ``state_dict`` maps onto ours by prefixing
``backbone.`` (and ``fc.`` -> ``head.``).
"""

from __future__ import annotations

from collections import OrderedDict

from torch import nn

from fedshift.core.errors import ModelError

from .base import FedModel

__all__ = ["build_resnet"]

#: torchvision's ResNet constructors this builder takes (``arch`` names one); torchvision is
#: imported on use (importing it costs seconds, and most runs use the small CNNs)
RESNETS = ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152")


def build_resnet(
    arch: str,
    num_classes: int,
    *,
    in_channels: int = 3,
    image_size: int = 32,
    small_input: bool = False,
) -> FedModel:
    """ResNet (He et al., 2016) from torchvision, randomly initialized.

    Options:
        small_input: CIFAR-style stem for small images (e.g. 32 px): ``conv1`` becomes a 3x3
            stride-1 convolution and the stem max-pool is removed. Default False (the ImageNet
            stem: 7x7 stride-2 conv + 3x3 stride-2 max-pool).

    ``in_channels != 3`` or ``small_input=True`` replace ``conv1``; the new conv is initialized
    the way torchvision initializes its convs (Kaiming normal, fan_out, ReLU).
    ``image_size`` does not change the architecture (global average pooling).
    """
    if arch not in RESNETS:
        raise ModelError(f"unknown resnet {arch!r}; choose one of: {', '.join(RESNETS)}")
    if int(num_classes) < 1:
        raise ModelError(f"num_classes must be >= 1, got {num_classes}")
    if int(in_channels) < 1:
        raise ModelError(f"in_channels must be >= 1, got {in_channels}")
    if not isinstance(small_input, bool):
        raise ModelError(f"option 'small_input' must be a bool, got {small_input!r}")
    from torchvision import models as tvm

    net = getattr(tvm, arch)(weights=None, num_classes=num_classes)
    embed_dim = net.fc.in_features
    if small_input or in_channels != 3:
        k, s, p = (3, 1, 1) if small_input else (7, 2, 3)
        net.conv1 = nn.Conv2d(in_channels, 64, kernel_size=k, stride=s, padding=p, bias=False)
        nn.init.kaiming_normal_(net.conv1.weight, mode="fan_out", nonlinearity="relu")
    if small_input:
        net.maxpool = nn.Identity()
    backbone = nn.Sequential(
        OrderedDict(
            conv1=net.conv1,
            bn1=net.bn1,
            relu=net.relu,
            maxpool=net.maxpool,
            layer1=net.layer1,
            layer2=net.layer2,
            layer3=net.layer3,
            layer4=net.layer4,
            avgpool=net.avgpool,
            flatten=nn.Flatten(),
        )
    )
    return FedModel(backbone, net.fc, embed_dim=embed_dim, num_classes=num_classes, arch=arch)
