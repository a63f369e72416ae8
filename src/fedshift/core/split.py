"""A split of labeled images: the tensor container every layer passes around, and the one
conversion from stored ``uint8`` pixels to model inputs.

A split's images are either a tensor or a :class:`RowGather`: the rows of one or more stored
tensors (a domain's memory-mapped cache file, or its in-memory pixels) picked by an index and
copied out only when read. :meth:`Split.subset` and :func:`concat_splits` build the latter, so
a client's share of a dataset is a few bytes per image, not a copy of its pixels; a batch
reads ``split.x[idx]`` (or a slice) and gets a fresh tensor of just those rows. Code that
needs a share's images all at once says so with :func:`dense`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
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


class RowGather:
    """Rows of stored tensors, gathered only when read: a lazy ``x[rows]``.

    ``sources`` are the stored tensors (same trailing shape and dtype), ``rows[i]`` the row of
    item ``i`` in ``sources[source[i]]`` (``source`` is None when there is one source).
    Indexing it like a tensor (an int, a slice, an integer or boolean index, optionally
    followed by indices of the trailing dimensions) returns a new tensor holding just the rows
    asked for, equal to indexing the eagerly gathered tensor the same way. It is read-only:
    writing to a returned tensor never changes the sources.
    """

    __slots__ = ("rows", "source", "sources")

    def __init__(
        self,
        sources: Sequence[torch.Tensor],
        rows: torch.Tensor,
        source: torch.Tensor | None = None,
    ):
        self.sources = tuple(sources)
        self.rows = rows
        self.source = source if len(self.sources) > 1 else None

    @classmethod
    def take(cls, images: torch.Tensor | RowGather, index) -> RowGather:
        """The items of ``images`` (a tensor or a RowGather) at ``index``, without a copy.

        ``index`` is a 1-D integer array or tensor; negative entries count from the end; an
        entry out of range raises IndexError here, not when a batch is read."""
        t = _as_index(index)
        n = len(images)
        if len(t) and (int(t.min()) < -n or int(t.max()) >= n):
            bad = int(t.max()) if int(t.max()) >= n else int(t.min())
            raise IndexError(f"index {bad} is out of bounds for {n} images")
        t = torch.where(t < 0, t + n, t)
        if isinstance(images, RowGather):
            source = None if images.source is None else images.source[t]
            return cls(images.sources, images.rows[t], source)
        return cls((images,), t)

    @classmethod
    def concat(cls, parts: Sequence[torch.Tensor | RowGather]) -> RowGather:
        """``parts`` one after the other (a lazy ``torch.cat``); a stored tensor shared by
        several parts stays one source."""
        if not parts:
            raise DatasetError("cannot concatenate no images")
        sources: list[torch.Tensor] = []
        rows, source = [], []
        for part in parts:
            gather = part if isinstance(part, RowGather) else cls((part,), torch.arange(len(part)))
            if gather.shape[1:] != parts[0].shape[1:] or gather.dtype != parts[0].dtype:
                raise DatasetError(
                    f"cannot concatenate images of shape {tuple(gather.shape[1:])} "
                    f"{gather.dtype} with {tuple(parts[0].shape[1:])} {parts[0].dtype}"
                )
            numbers = []
            for tensor in gather.sources:
                found = next((k for k, s in enumerate(sources) if s is tensor), None)
                if found is None:
                    sources.append(tensor)
                    found = len(sources) - 1
                numbers.append(found)
            local = gather.source if gather.source is not None else torch.zeros_like(gather.rows)
            source.append(torch.as_tensor(numbers, dtype=torch.long)[local])
            rows.append(gather.rows)
        return cls(sources, torch.cat(rows), torch.cat(source))

    # -- the tensor-like surface ---------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self.rows), *self.sources[0].shape[1:]))

    @property
    def dtype(self) -> torch.dtype:
        return self.sources[0].dtype

    @property
    def device(self) -> torch.device:
        return self.sources[0].device

    def dim(self) -> int:
        return self.sources[0].dim()

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[torch.Tensor]:
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        shape, count = tuple(self.shape), len(self.sources)
        return f"RowGather(shape={shape}, dtype={self.dtype}, sources={count})"

    def __getitem__(self, key) -> torch.Tensor:
        if (
            key is Ellipsis
            or key is None
            or (isinstance(key, tuple) and key and (key[0] is Ellipsis or key[0] is None))
        ):
            return self.materialize()[key]
        rest = ()
        if isinstance(key, tuple):
            key, rest = (key[0] if key else slice(None)), key[1:]
        if isinstance(key, np.ndarray):
            key = torch.from_numpy(key)
        rows = self.rows[key]
        if rows.dim() == 0:  # one item: its image, without the row dimension
            k = 0 if self.source is None else int(self.source[key])
            image = self.sources[k][int(rows)].clone()
            return image[rest] if rest else image
        images = self._gather(rows, None if self.source is None else self.source[key])
        return images[(slice(None), *rest)] if rest else images

    def _gather(self, rows: torch.Tensor, source: torch.Tensor | None) -> torch.Tensor:
        if source is None:
            return torch.index_select(self.sources[0], 0, rows)
        out = torch.empty((len(rows), *self.shape[1:]), dtype=self.dtype, device=self.device)
        for k in torch.unique(source).tolist():
            hit = (source == k).nonzero()[:, 0]
            out[hit] = torch.index_select(self.sources[k], 0, rows[hit])
        return out

    def materialize(self) -> torch.Tensor:
        """Every item, gathered into one new tensor (the eager ``x[rows]``)."""
        return self._gather(self.rows, self.source)


Images = torch.Tensor | RowGather


def dense(images: Images | None) -> torch.Tensor | None:
    """``images`` as one tensor: a RowGather is gathered (a copy), a tensor returned as is."""
    return images.materialize() if isinstance(images, RowGather) else images


@dataclass(frozen=True, eq=False)
class Split:
    """One split of a domain: images ``x`` (uint8, N×C×H×W), labels ``y`` (int64, N).

    ``mask`` is an optional per-pixel label map (uint8, N×H×W) of nested regions: a
    segmentation model's channel c predicts ``mask > c`` (digits-dg, prostate: {0, 1}, the
    foreground; fundus: 0 background, 1 optic disc without cup, 2 cup).
    ``x`` and ``mask`` are tensors or :class:`RowGather` views (see the module docstring):
    read them by index or slice (``split.x[idx]``), or gather them whole with :func:`dense`.
    """

    x: Images
    y: torch.Tensor
    mask: Images | None = None

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
        """The samples at ``idx`` (a 1-D integer array or tensor) as a new Split whose images
        (and masks) are a :class:`RowGather` view of these: no pixel is copied."""
        t = _as_index(idx)
        return Split(
            x=RowGather.take(self.x, t),
            y=self.y[t],
            mask=None if self.mask is None else RowGather.take(self.mask, t),
        )


def concat_splits(splits: Sequence[Split]) -> Split:
    """``splits`` one after the other, images and masks as a :class:`RowGather` view (the
    masks only when every split has them)."""
    masks = [s.mask for s in splits]
    mask = RowGather.concat(masks) if all(m is not None for m in masks) else None
    return Split(
        x=RowGather.concat([s.x for s in splits]),
        y=torch.cat([s.y for s in splits]),
        mask=mask,
    )
