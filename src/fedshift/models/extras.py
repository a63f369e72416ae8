"""The optional packages some backbones need (timm, the ``pretrained`` extra), named without
importing them: ``timm`` is imported on first use, so a run or a listing that never builds a
timm model does not pay for it."""

from __future__ import annotations

from fedshift.core.errors import ModelError

__all__ = ["LITE_PREFIX", "PRETRAINED_EXTRA", "TIMM_PREFIX", "timm_module"]

#: how a user installs what these models need
PRETRAINED_EXTRA = "pip install -e '.[pretrained]' (or: pip install timm)"
#: the model-name prefix of any timm architecture (``timm:resnet18``)
TIMM_PREFIX = "timm:"
#: fedshift's names of the EfficientNet-Lite variants (``efficientnet-lite0`` is timm's
#: ``tf_efficientnet_lite0``)
LITE_PREFIX = "efficientnet-lite"


def timm_module():
    """The timm module, or a one-line error naming the extra that installs it."""
    try:
        import timm
    except ImportError:
        raise ModelError(
            f"this model needs timm, which is not installed: {PRETRAINED_EXTRA}"
        ) from None
    return timm
