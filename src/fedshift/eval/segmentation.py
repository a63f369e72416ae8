"""Segmentation: Dice loss and score, boundary regions, mask batches.

With ``problem = "segmentation"`` a run predicts each image's per-pixel masks
(``Split.mask``, e.g. digits-dg's digit strokes, fundus's optic disc and cup) instead of its
class. ``Split.mask`` is a label map of nested regions: the model has one output channel per
region and channel c's target is ``mask > c`` (one channel, masks in {0, 1}: the mask
itself; fundus: channel 0 disc = labels {1, 2}, channel 1 cup = label {2}). The loss is the
soft Dice loss of the FedDG-ELCFS official code (``utils/losses.py``: per output channel
``1 - (2·Σ p·t + s) / (Σ p + Σ t + s)`` over the whole batch, ``s = 1e-5``, p = sigmoid,
averaged over channels) and the metric is the hard Dice of the thresholded prediction per
image and channel, averaged over images, then over channels (``utils/util.py``'s
``_eval_dice`` per channel; its test reports each channel and their mean).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

from fedshift.core.context import SplitView
from fedshift.core.errors import DatasetError
from fedshift.core.split import Split, to_input

Predict = Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]

DICE_SMOOTH = 1e-5
#: scipy.ndimage's default structuring element (connectivity 1), used by the official code
_CROSS = torch.tensor([[0.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 0.0]]).view(1, 1, 3, 3)


def soft_dice_loss(probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``1 - mean_c (2·Σ p·t + s) / (Σ p + Σ t + s)``; ``probs``, ``target``: ``(N, C, H, W)``."""
    dims = (0, 2, 3)
    intersect = (probs * target).sum(dims)
    total = probs.sum(dims) + target.sum(dims)
    return 1.0 - ((2.0 * intersect + DICE_SMOOTH) / (total + DICE_SMOOTH)).mean()


def channel_targets(mask: torch.Tensor, channels: int) -> torch.Tensor:
    """Per-channel binary targets ``(N, channels, H, W)`` float of label maps ``(N, 1, H, W)``:
    channel c is ``mask > c``."""
    return torch.cat([(mask > c) for c in range(channels)], dim=1).float()


def segmentation_loss(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Soft Dice of ``sigmoid(logits)`` ``(N, C, H, W)`` against label maps ``(N, 1, H, W)``."""
    return soft_dice_loss(torch.sigmoid(logits), channel_targets(mask, logits.shape[1]))


def dice_per_image(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Hard Dice of binary masks ``(N, H, W)`` per image; 1 where both masks are empty."""
    pred, target = pred.flatten(1).float(), target.flatten(1).float()
    intersect = (pred * target).sum(1)
    total = pred.sum(1) + target.sum(1)
    return torch.where(total > 0, 2.0 * intersect / total.clamp_min(1.0), torch.ones_like(total))


def _erode(mask: torch.Tensor) -> torch.Tensor:
    hits = F.conv2d(mask, _CROSS.to(mask), padding=1)
    return (hits >= 5.0).to(mask.dtype)


def _dilate(mask: torch.Tensor) -> torch.Tensor:
    return (F.conv2d(mask, _CROSS.to(mask), padding=1) > 0).to(mask.dtype)


def boundary_regions(mask: torch.Tensor, ring: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """The contour and the surrounding background ring of binary masks ``(N, 1, H, W)``.

    As in the official ELCFS data loader: contour = mask − erosion(mask) (one step,
    cross-shaped element, outside the image counts as background); background =
    dilation^ring(mask) − mask (``ring`` = 5 steps).
    """
    mask = mask.float()
    contour = mask - _erode(mask)
    grown = mask
    for _ in range(ring):
        grown = _dilate(grown)
    return contour, grown - mask


def check_masks(splits: list[Split], what: str) -> None:
    """Raise a clear error when a split lacks per-pixel masks."""
    if any(s.mask is None for s in splits):
        raise DatasetError(
            f"task 'segmentation' needs per-pixel masks (Split.mask) but {what} has none; "
            "digits-dg ships them for every domain"
        )


def mask_batches(
    view: SplitView, batch_size: int, rng: torch.Generator | None, *, shuffle: bool = True
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """``(x, mask)`` batches: x normalized to [-1, 1], mask the label maps as float
    ``(B, 1, H, W)`` (see :func:`channel_targets`)."""
    masks = view.mask
    if masks is None:
        raise DatasetError("task 'segmentation' needs per-pixel masks; this split has none")
    n = len(view)
    order = torch.randperm(n, generator=rng) if shuffle else torch.arange(n)
    for start in range(0, n, batch_size):
        idx = order[start : start + batch_size]
        x = to_input(view.x[idx], view.device)
        yield x, masks[idx].unsqueeze(1).to(view.device, torch.float32)


@torch.no_grad()
def dice_per_channel(
    model: torch.nn.Module,
    split: Split,
    device: torch.device,
    predict: Predict,
    batch_size: int = 500,
) -> list[float]:
    """Per output channel c, the mean per-image Dice of ``predict(model, x)[:, c] > 0``
    (sigmoid > 0.5) against ``mask > c``."""
    if len(split) == 0:
        return [float("nan")]
    check_masks([split], "this split")
    model.to(device).eval()
    scores: list[list[torch.Tensor]] = []
    for start in range(0, len(split), batch_size):
        x = to_input(split.x[start : start + batch_size], device)
        target = split.mask[start : start + batch_size].to(device)
        logits = predict(model, x)
        if not scores:
            scores = [[] for _ in range(logits.shape[1])]
        for c, channel in enumerate(scores):
            channel.append(dice_per_image(logits[:, c] > 0, target > c).cpu())
    return [float(torch.cat(channel).mean()) for channel in scores]


def dice(
    model: torch.nn.Module,
    split: Split,
    device: torch.device,
    predict: Predict,
    batch_size: int = 500,
) -> float:
    """The mean over output channels of :func:`dice_per_channel`."""
    per_channel = dice_per_channel(model, split, device, predict, batch_size)
    return sum(per_channel) / len(per_channel)
