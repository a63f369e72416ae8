"""A split of labeled images: the tensor container every layer passes around, and the one
conversion from stored ``uint8`` pixels to model inputs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fedshift.core.errors import DatasetError


def to_input(x_uint8: torch.Tensor, device: torch.device) -> torch.Tensor:
    """uint8 images -> float32 in [-1, 1] on ``device``."""
    return (x_uint8.to(device, non_blocking=True).float() / 127.5) - 1.0


def _as_index(idx) -> torch.Tensor:
    if isinstance(idx, torch.Tensor):
        t = idx.to(torch.long)
    else:
        arr = np.asarray(idx)
        if arr.size == 0:
            arr = arr.astype(np.int64)
        if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
            raise DatasetError(f"subset index must be a 1-D integer array, got dtype {arr.dtype}")
        t = torch.from_numpy(arr.astype(np.int64, copy=False))
    if t.dim() != 1:
        raise DatasetError(f"subset index must be 1-D, got shape {tuple(t.shape)}")
    return t


@dataclass(frozen=True, eq=False)
class Split:
    """One split of a domain: images ``x`` (uint8, N×C×H×W), labels ``y`` (int64, N).

    ``mask`` is an optional per-pixel label map (uint8, N×H×W) of nested regions: a
    segmentation model's channel c predicts ``mask > c`` (digits-dg, prostate: {0, 1}, the
    foreground; fundus: 0 background, 1 optic disc without cup, 2 cup).
    """

    x: torch.Tensor
    y: torch.Tensor
    mask: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.x.dim() != 4:
            raise DatasetError(f"Split.x must have shape (N, C, H, W), got {tuple(self.x.shape)}")
        if self.y.dim() != 1 or self.y.shape[0] != self.x.shape[0]:
            raise DatasetError(
                f"Split.y must have shape ({self.x.shape[0]},), got {tuple(self.y.shape)}"
            )
        if self.mask is not None:
            n, _, h, w = self.x.shape
            if tuple(self.mask.shape) != (n, h, w):
                raise DatasetError(
                    f"Split.mask must have shape {(n, h, w)}, got {tuple(self.mask.shape)}"
                )

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, idx) -> Split:
        """Return the samples at ``idx`` (a 1-D integer array or tensor) as a new Split."""
        t = _as_index(idx)
        return Split(
            x=self.x[t],
            y=self.y[t],
            mask=None if self.mask is None else self.mask[t],
        )
