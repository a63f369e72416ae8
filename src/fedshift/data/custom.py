"""Bring your own data: any map-style dataset or tensors as the domains of a run.

A domain is given as a map-style ``torch.utils.data.Dataset`` (anything with ``__len__`` and
``__getitem__``) whose items are ``(image, label)`` -- or ``(image, mask)`` for segmentation
-- or as a tuple of tensors ``(images, labels)``; either one split (cut into train / val /
test with a fixed seed) or a dict of splits ``{"train": ..., "val": ..., "test": ...}``.

Images may be ``uint8`` in [0, 255] (stored as they are), other integers in [0, 255], or
floats: **floats in [0, 1] are scaled by 255; floats in [-1, 1] with a value below 0 are
taken as ``2 * x - 1`` normalized** (mapped back by ``(x + 1) * 127.5``); any other range is a
:class:`DatasetError` naming the domain and the observed range (normalize with mean/std
only after fedshift's own conversion -- models receive [-1, 1]). Images are ``(C, H, W)``,
``(H, W)`` or PIL images; all must share one size and channel count.

:func:`register_dataset` makes a dataset loadable by name (``--dataset NAME``); plug-ins
do the same through entry points of group ``fedshift.datasets`` (a loader or a dataset).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from fedshift.data.domains import DatasetError, Domain, DomainDataset
from fedshift.plugins import load_plugin, plugin_names, plugin_source

if TYPE_CHECKING:  # torch loads only when data is read, not to list or describe it
    import torch

    from fedshift.core.split import Split


SPLITS = ("train", "val", "test")
#: shares of a domain given as one split that become validation and test data
VAL_FRACTION = 0.1
TEST_FRACTION = 0.2

#: name -> (loader or dataset, description) of datasets added by :func:`register_dataset`
_REGISTERED: dict[str, tuple[Any, str]] = {}


def _as_image(item: Any, where: str) -> torch.Tensor:
    import torch

    if hasattr(item, "convert") and hasattr(item, "size"):  # a PIL image
        item = np.asarray(item)
        if item.ndim == 3:
            item = item.transpose(2, 0, 1)
    if isinstance(item, np.ndarray):
        item = torch.from_numpy(np.ascontiguousarray(item))
    if not isinstance(item, torch.Tensor):
        raise DatasetError(
            f"{where}: an image must be a tensor, array or PIL image, got {type(item).__name__}"
        )
    if item.dim() == 2:
        item = item[None]
    if item.dim() != 3:
        raise DatasetError(
            f"{where}: an image must be (C, H, W) or (H, W), got {tuple(item.shape)}"
        )
    return item


def _to_uint8(x: torch.Tensor, domain: str) -> torch.Tensor:
    """Images in a documented range -> uint8 [0, 255]; another range is a DatasetError."""
    import torch

    if x.dtype == torch.uint8:
        return x
    if x.numel() == 0:
        return x.to(torch.uint8)
    if x.dtype == torch.bool or x.is_complex():
        raise DatasetError(f"domain {domain!r}: images of dtype {x.dtype} are not supported")
    low, high = float(x.min()), float(x.max())
    observed = f"observed range [{low:.4g}, {high:.4g}]"
    if not x.is_floating_point():
        if low < 0 or high > 255:
            raise DatasetError(f"domain {domain!r}: integer images must be in [0, 255], {observed}")
        return x.to(torch.uint8)
    if not (math.isfinite(low) and math.isfinite(high)):
        raise DatasetError(f"domain {domain!r}: images hold NaN or infinite values")
    if 0 <= low and high <= 1:
        scaled = x * 255.0
    elif -1 <= low and high <= 1:
        scaled = (x + 1.0) * 127.5
    else:
        raise DatasetError(
            f"domain {domain!r}: float images must be in [0, 1] or [-1, 1], {observed}; "
            "give uint8 pixels or undo the mean/std normalization (fedshift maps images "
            "to [-1, 1] itself)"
        )
    return scaled.round().clamp(0, 255).to(torch.uint8)


def _label(value: Any, where: str) -> int:
    import torch

    if isinstance(value, torch.Tensor | np.ndarray):
        if int(np.prod(value.shape)) != 1:
            raise DatasetError(f"{where}: a label must be one integer, got shape {value.shape}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise DatasetError(f"{where}: a label must be an integer, got {value!r}")
    return int(value)


def _split_of(data: Any, domain: str, split: str, segmentation: bool) -> Split:
    """One split from tensors ``(images, labels)`` or a map-style dataset of pairs."""
    import torch

    from fedshift.core.split import Split

    where = f"domain {domain!r} ({split})"
    if isinstance(data, Split):
        return data
    if isinstance(data, Mapping):  # has __len__ and __getitem__, but its keys are not 0..N-1
        keys = ", ".join(map(repr, list(data)[:4]))
        raise DatasetError(
            f"{where}: expected (images, labels) tensors or a map-style dataset of (image, "
            f"label) pairs, got a mapping (keys {keys or 'none'})"
        )
    if (
        isinstance(data, tuple | list)
        and len(data) == 2
        and all(isinstance(t, torch.Tensor | np.ndarray) for t in data)
    ):
        x, y = (torch.as_tensor(t) for t in data)
        if x.dim() == 3:
            x = x[:, None]
        if x.dim() != 4:
            raise DatasetError(f"{where}: images must be (N, C, H, W), got {tuple(x.shape)}")
        if x.shape[0] != y.shape[0]:
            raise DatasetError(f"{where}: {x.shape[0]} images but {y.shape[0]} labels")
        if segmentation:
            return _segmentation_split(_to_uint8(x, domain), y, where)
        if y.dim() != 1 or y.is_floating_point():
            raise DatasetError(f"{where}: labels must be a 1-D integer tensor")
        return Split(x=_to_uint8(x, domain), y=y.to(torch.int64))
    if not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
        raise DatasetError(
            f"{where}: expected a map-style torch Dataset (with __len__ and __getitem__) or "
            f"(images, labels) tensors, got {type(data).__name__}"
        )
    images, targets = [], []
    for i in range(len(data)):
        item = data[i]
        if not (isinstance(item, tuple | list) and len(item) >= 2):
            raise DatasetError(
                f"{where}: item {i} must be (image, label), got {type(item).__name__}"
            )
        images.append(_as_image(item[0], f"{where} item {i}"))
        if segmentation:
            targets.append(torch.as_tensor(np.asarray(item[1])))
        else:
            targets.append(_label(item[1], f"{where} item {i}"))
    if not images:
        raise DatasetError(f"{where} is empty")
    shapes = {tuple(im.shape) for im in images}
    if len(shapes) > 1:
        raise DatasetError(
            f"{where}: images differ in shape ({', '.join(map(str, sorted(shapes)[:3]))}); "
            "resize them to one size first"
        )
    x = _to_uint8(torch.stack(images), domain)
    if segmentation:
        return _segmentation_split(x, torch.stack(targets), where)
    return Split(x=x, y=torch.tensor(targets, dtype=torch.int64))


def _segmentation_split(x: torch.Tensor, masks: torch.Tensor, where: str) -> Split:
    import torch

    from fedshift.core.split import Split

    if masks.dim() == 4 and masks.shape[1] == 1:
        masks = masks[:, 0]
    if tuple(masks.shape) != (x.shape[0], x.shape[2], x.shape[3]):
        raise DatasetError(
            f"{where}: masks must be (N, H, W) matching the images, got {tuple(masks.shape)}"
        )
    if not bool(((masks == 0) | (masks == 1)).all()):
        raise DatasetError(f"{where}: masks must hold only 0 and 1")
    return Split(x=x, y=torch.zeros(x.shape[0], dtype=torch.int64), mask=masks.to(torch.uint8))


def _cut(split: Split, seed: int) -> tuple[Split, Split, Split]:
    import torch

    n = len(split)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val, n_test = round(n * VAL_FRACTION), round(n * TEST_FRACTION)
    return (
        split.subset(order[n_val + n_test :]),
        split.subset(order[:n_val]),
        split.subset(order[n_val : n_val + n_test]),
    )


def make_dataset(
    domains: Mapping[str, Any],
    *,
    name: str = "custom",
    classes: Sequence[str] | None = None,
    segmentation: bool = False,
    seed: int = 0,
) -> DomainDataset:
    """A :class:`DomainDataset` from ``{domain name: data}`` (see the module docstring).

    A domain given as one split is cut 70/10/20 into train/val/test with ``seed``.
    ``classes`` default to ``"0"..str(max label)``. Raises DatasetError naming the domain.
    """
    import torch

    if isinstance(domains, DomainDataset):
        return domains
    if not isinstance(domains, Mapping) or not domains:
        raise DatasetError("a dataset needs a non-empty mapping {domain name: data}")
    built: dict[str, Domain] = {}
    for domain, data in domains.items():
        if isinstance(data, Mapping):
            missing = [s for s in SPLITS if s not in data]
            if missing:
                raise DatasetError(f"domain {domain!r}: splits {', '.join(missing)} missing")
            splits = [_split_of(data[s], domain, s, segmentation) for s in SPLITS]
        else:
            splits = list(_cut(_split_of(data, domain, "all", segmentation), seed))
        built[str(domain)] = Domain(str(domain), *splits)
    shapes = {d: tuple(d_.train.x.shape[1:]) for d, d_ in built.items()}
    if len(set(shapes.values())) > 1:
        raise DatasetError(f"domains differ in image shape: {shapes}; resize them to one size")
    channels, height, width = next(iter(shapes.values()))
    if height != width:
        raise DatasetError(f"images must be square, got {height}x{width}")
    labels = torch.cat([s.y for d in built.values() for s in (d.train, d.val, d.test)])
    if bool((labels < 0).any()):
        raise DatasetError("labels must be >= 0")
    num_classes = int(labels.max()) + 1 if labels.numel() else 1
    if classes is None:
        classes = ["foreground"] if segmentation else [str(i) for i in range(num_classes)]
    elif len(classes) < num_classes:
        raise DatasetError(f"{len(classes)} class names for labels up to {num_classes - 1}")
    return DomainDataset(
        name=name,
        domains=built,
        classes=list(classes),
        channels=channels,
        image_size=height,
        meta={"source": "custom"},
    )


def register_dataset(name: str, data: Any, description: str = "", *, replace: bool = False) -> None:
    """Make ``data`` loadable as ``dataset=name``: a :class:`DomainDataset`, a mapping
    ``{domain: data}`` (see :func:`make_dataset`) or a function returning either."""
    if name in _REGISTERED and _REGISTERED[name][0] is not data and not replace:
        raise DatasetError(f"dataset {name!r} is registered already; pass replace=True")
    _REGISTERED[name] = (data, description or "registered from Python")


def _materialize(name: str, data: Any, seed: int) -> DomainDataset:
    if callable(data) and not isinstance(data, Mapping | DomainDataset):
        try:
            data = data()
        except DatasetError:
            raise
        except Exception as exc:  # noqa: BLE001 - a user's loader may raise anything
            raise DatasetError(
                f"dataset {name!r}: its loader failed: {type(exc).__name__}: {exc}"
            ) from None
    ds = make_dataset(data, name=name, seed=seed)
    return ds


def registered_datasets() -> dict[str, str]:
    """Name -> description of the datasets added by :func:`register_dataset`."""
    return {name: desc for name, (_, desc) in _REGISTERED.items()}


def custom_datasets() -> dict[str, str]:
    """Name -> origin of the registered and installed plug-in datasets (nothing is loaded)."""
    out = {name: "registered" for name in _REGISTERED}
    for name in plugin_names("dataset"):
        out.setdefault(name, f"plug-in {plugin_source('dataset', name)}")
    return out


def load_custom_dataset(name: str, seed: int = 0) -> DomainDataset | None:
    """The registered or plug-in dataset ``name``; None when there is none of that name."""
    if name in _REGISTERED:
        return _materialize(name, _REGISTERED[name][0], seed)
    data = load_plugin("dataset", name)
    if data is None:
        return None
    return _materialize(name, data, seed)
