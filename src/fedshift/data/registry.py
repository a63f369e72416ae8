"""Dataset names -> datasets: one resolver (:func:`load_dataset`) over the sources a name may
come from (:data:`SOURCES`: catalog, registered or plug-in, embedded, folder)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from fedshift.core.errors import did_you_mean
from fedshift.data import digits
from fedshift.data.catalog import RUNNABLE, full_split_refusal, load_catalog
from fedshift.data.custom import custom_datasets, load_custom_dataset
from fedshift.data.domains import DatasetError, Domain, DomainDataset
from fedshift.data.folder import load_folder_dataset
from fedshift.data.formats.images import resize_uint8

if TYPE_CHECKING:  # torch loads only when data is read, not to list or describe it
    from fedshift.core.split import Split


DATASETS: dict[str, str] = {digits.NAME: digits.DESCRIPTION}

_FOLDER_PREFIX = "folder:"
#: the generic folder fallback (``-d PATH`` for any ``ROOT/<domain>/<class>/<image>`` tree)
#: is resized to this side unless the run sets image_size
FOLDER_IMAGE_SIZE = 64
#: catalog entries fedshift can run (each needs ``data_root``)
CATALOG_LOADERS = RUNNABLE


def _resize_split(split: Split, size: int) -> Split:
    import torch

    from fedshift.core.split import Split, dense

    if split.x.shape[-1] == size and split.x.shape[-2] == size:
        return split
    split = Split(x=dense(split.x), y=split.y, mask=dense(split.mask))  # resizing makes a copy
    if len(split) == 0:
        x = split.x.new_zeros((0, split.x.shape[1], size, size))
        m = None if split.mask is None else split.mask.new_zeros((0, size, size))
        return Split(x=x, y=split.y, mask=m)
    x = resize_uint8(split.x, size)
    mask = None
    if split.mask is not None:
        mask = torch.nn.functional.interpolate(
            split.mask[:, None].float(), size=(size, size), mode="nearest"
        )[:, 0].to(torch.uint8)
    return Split(x=x, y=split.y, mask=mask)


def resized(ds: DomainDataset, size: int) -> DomainDataset:
    """``ds`` with every split resized to ``size`` px (itself when it has that size already)."""
    if size == ds.image_size:
        return ds
    domains = {
        name: Domain(
            name=name,
            train=_resize_split(d.train, size),
            val=_resize_split(d.val, size),
            test=_resize_split(d.test, size),
        )
        for name, d in ds.domains.items()
    }
    meta = {**ds.meta, "native_image_size": ds.image_size}
    return DomainDataset(
        name=ds.name,
        domains=domains,
        classes=list(ds.classes),
        channels=ds.channels,
        image_size=size,
        meta=meta,
    )


def restrict_domains(ds: DomainDataset, names: list[str]) -> DomainDataset:
    """The dataset with only the domains ``names`` (in that order); unknown names raise."""
    if not names:
        raise DatasetError(f"no domains listed after ':'; valid domains: {', '.join(ds.domains)}")
    if len(set(names)) != len(names):
        raise DatasetError(f"domains repeat in {','.join(names)}")
    domains = {n: ds.domain(n) for n in names}
    return DomainDataset(
        name=f"{ds.name}:{','.join(names)}",
        domains=domains,
        classes=list(ds.classes),
        channels=ds.channels,
        image_size=ds.image_size,
        meta=dict(ds.meta),
    )


def _split_domains(key: str) -> tuple[str, list[str] | None]:
    """``name:dom1,dom2`` -> (``name``, [dom1, dom2]) when ``name`` is a dataset by itself."""
    base, sep, tail = key.rpartition(":")
    if not sep or not base or base == _FOLDER_PREFIX[:-1]:
        return key, None
    if (
        base in DATASETS
        or base in CATALOG_LOADERS
        or base.startswith(_FOLDER_PREFIX)
        or Path(base).expanduser().is_dir()
    ):
        if Path(key).expanduser().is_dir():
            return key, None
        return base, [d.strip() for d in tail.split(",") if d.strip()]
    return key, None


@dataclass(frozen=True)
class LoadOptions:
    """How :func:`load_dataset` was asked to load a name (each source reads what it needs)."""

    image_size: int | None
    cache_dir: str | os.PathLike | None
    seed: int
    data_root: str | os.PathLike | None
    split_files: str | os.PathLike | None
    only: list[str] | None  # NAME:d1,d2: the domains kept
    catalog_split: str = "default"
    held_out_test: bool = False  # the domains also train: hold out a test part (catalog)


def _from_catalog(key: str, options: LoadOptions) -> DomainDataset | None:
    if key not in CATALOG_LOADERS:
        return None
    if not options.data_root:
        raise DatasetError(
            f"dataset {key!r} is read from your copy: give --set data_root=PATH "
            f"(check it with `fedshift datasets check {key} --root PATH`)"
        )
    return load_catalog(
        key,
        options.data_root,
        image_size=options.image_size,
        seed=options.seed,
        split_files=options.split_files or "",
        domains=options.only,
        cache_dir=options.cache_dir,
        catalog_split=options.catalog_split,
        held_out_test=options.held_out_test,
    )


def _from_registry(key: str, options: LoadOptions) -> DomainDataset | None:
    ds = load_custom_dataset(key, seed=options.seed)
    if ds is None or options.image_size is None:
        return ds
    return resized(ds, options.image_size)


def _embedded(key: str, options: LoadOptions) -> DomainDataset | None:
    if key not in DATASETS:
        return None
    ds = digits.load_digits_dg(cache_dir=options.cache_dir)
    return ds if options.image_size is None else resized(ds, options.image_size)


def _from_folder(key: str, options: LoadOptions) -> DomainDataset | None:
    if key.startswith(_FOLDER_PREFIX):
        path = key[len(_FOLDER_PREFIX) :]
        if not path:
            raise DatasetError("'folder:' needs a path, e.g. folder:/data/PACS")
    elif key and Path(key).expanduser().is_dir():
        path = key
    else:
        return None
    size = FOLDER_IMAGE_SIZE if options.image_size is None else options.image_size
    return load_folder_dataset(path, image_size=size, seed=options.seed)


@dataclass(frozen=True)
class DatasetSource:
    """One place a dataset name may come from: its ``names`` (for the unknown-name error and
    its suggestion) and ``load`` (None when the name is not one of its own)."""

    label: str
    names: Callable[[], Iterable[str]]
    load: Callable[[str, LoadOptions], DomainDataset | None]


#: where a dataset name is looked up, in this order: the catalog (your copy of a published
#: dataset), registered and plug-in datasets, the embedded digits-dg, a folder on disk
SOURCES: tuple[DatasetSource, ...] = (
    DatasetSource("catalog (--set data_root=PATH)", lambda: CATALOG_LOADERS, _from_catalog),
    DatasetSource("registered or plug-in", lambda: custom_datasets(), _from_registry),
    DatasetSource("embedded", lambda: DATASETS, _embedded),
    DatasetSource(
        "or a folder: an existing directory laid out as ROOT/<domain>/<class>/<image> "
        "(optionally as folder:PATH)",
        lambda: (),
        _from_folder,
    ),
)


def unknown_dataset(key: str) -> DatasetError:
    """The error for a name no source knows: every source with its names, and the nearest."""
    known = {source.label: list(source.names()) for source in SOURCES}
    every = [name for names in known.values() for name in names]
    listed = "; ".join(
        f"{label}: {', '.join(names) or 'none'}" if label != SOURCES[-1].label else label
        for label, names in known.items()
    )
    return DatasetError(f"unknown dataset {key!r}{did_you_mean(key, every)}; {listed}")


def load_dataset(
    name: str | os.PathLike,
    *,
    image_size: int | None = None,
    cache_dir: str | os.PathLike | None = None,
    seed: int = 0,
    data_root: str | os.PathLike | None = None,
    split_files: str | os.PathLike | None = None,
    catalog_split: str = "default",
    held_out_test: bool = False,
) -> DomainDataset:
    """Load a dataset by name, resolved by :data:`SOURCES` in order: a catalog entry
    (``pacs``, ``office-home``, ``domainnet``, ...), a registered or plug-in dataset, the
    embedded ``digits-dg``, then ``folder:PATH`` or an existing directory.

    ``NAME:dom1,dom2`` keeps only the listed domains (e.g. ``digits-dg:mnist`` for label-skew
    experiments on a single domain). ``digits-dg`` is built once and cached in ``cache_dir``
    (default ``$FEDSHIFT_CACHE`` or ``~/.cache/fedshift``); its content does not depend on
    ``seed``. For folder datasets ``seed`` fixes the train/val/test split and ``image_size``
    defaults to 64. A catalog entry is read from ``data_root`` at its own resolution (224 px)
    with the split its catalog entry states (official lists, else a ``seed``-ed holdout), or
    the user's lists in ``split_files``; its decoded images are cached under ``cache_dir`` and
    memory-mapped; ``catalog_split=full`` reads the whole official files where the entry
    samples them down (Digit-Five); ``held_out_test=True`` (the run's domains also train and
    are scored: per-domain, personalized) makes an entry whose test split is the whole domain
    hold out a test part instead, disjoint from train and val (FPL's rule, 20 %). A name no
    source knows is a DatasetError naming every source and the nearest name.
    """
    if image_size is not None and (isinstance(image_size, bool) or int(image_size) < 1):
        raise DatasetError(f"image_size must be a positive integer, got {image_size!r}")
    key = os.fspath(name) if isinstance(name, os.PathLike) else name
    if not isinstance(key, str):
        raise DatasetError(f"dataset name must be a string or path, got {type(name).__name__}")
    key, only = _split_domains(key)
    if split_files and key not in CATALOG_LOADERS:
        raise DatasetError(
            f"split_files applies to the catalog datasets ({', '.join(CATALOG_LOADERS)}), "
            f"not to {key!r}"
        )
    if catalog_split != "default" and key not in CATALOG_LOADERS:
        raise DatasetError(full_split_refusal(key))
    size = None if image_size is None else int(image_size)
    options = LoadOptions(
        size, cache_dir, seed, data_root, split_files, only, catalog_split, held_out_test
    )
    for source in SOURCES:
        ds = source.load(key, options)
        if ds is not None:
            return ds if only is None else restrict_domains(ds, only)
    raise unknown_dataset(key)


def describe_datasets(cache_dir: str | os.PathLike | None = None) -> list[dict]:
    """Name, description, per-domain split sizes and class count of each built-in dataset.

    Loads (building on first use) each dataset.
    """
    out = []
    for name, desc in DATASETS.items():
        ds = load_dataset(name, cache_dir=cache_dir)
        out.append(
            {
                "name": name,
                "description": desc,
                "domains": {
                    d: {"train": len(dom.train), "val": len(dom.val), "test": len(dom.test)}
                    for d, dom in ds.domains.items()
                },
                "classes": ds.num_classes,
            }
        )
    return out
