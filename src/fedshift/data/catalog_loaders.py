"""Loading catalog datasets (``fedshift run -d NAME --set data_root=PATH``) as their authors
distribute them, with the split each entry of :mod:`fedshift.data.catalog` states.

* Official lists (PACS's kfold lists, DomainNet's ``<domain>_train.txt`` / ``_test.txt``):
  they define the splits and the class order. DomainNet has no validation list: a seeded
  stratified ``VAL_FRACTION`` of its train list becomes val; its test list is the test split.
* No official lists (Office-Home, VLCS, Terra Incognita, Office-Caltech10, Office-31): each
  domain's images split by DomainBed's seeded 80/20 holdout (``split_seed``), stratified by
  class, into train / val; the test split is the whole domain, so a held-out target domain
  is scored on all its images (the domain-generalization protocol). Classes are the sorted
  class folder names (DomainBed's ImageFolder order).
* CIFAR-10 / CIFAR-100 (:mod:`fedshift.data.cifar`): the official train and test binary
  files, one domain named like the dataset; val is the seeded ``VAL_FRACTION`` holdout of
  the train file.
* Fundus / Prostate (:mod:`fedshift.data.elcfs_sets`): FedDG-ELCFS's ``.npy`` release,
  per-pixel masks; per site a seeded holdout of the files as train / val, test the site.
* Digit-Five (:mod:`fedshift.data.digit_five`): each domain's public files; KD3A/FACT's seeded
  25,000 of the train file (val: its seeded ``VAL_FRACTION`` holdout), the first 9,000 of the
  test file as test.
* ``split_files=DIR``: the user's own ``<domain>_{train,val,test}.txt`` lists (``<relative
  path> <label>``, paths relative to the dataset's image root, 0-based labels in the
  dataset's class order); without a val list, val is the seeded holdout of the train list.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from fedshift.data import cifar, digit_five, elcfs_sets, image_cache, pacs
from fedshift.data.catalog import CATALOG, CatalogEntry
from fedshift.data.domains import DatasetError, DomainDataset
from fedshift.data.lists import (
    VAL_FRACTION,
    Entry,
    class_folders,
    decode_dataset,
    folder_entries,
    holdout,
    list_classes,
    read_split_list,
)

#: catalog entries read from ``ROOT/<domain>/<class>/<image>`` with a seeded holdout
FOLDER_DATASETS = ("office-home", "vlcs", "terra-incognita", "office-caltech10", "office31")
#: catalog entries read from DomainNet's official train/test lists
DOMAINNET_DATASETS = ("domainnet", "domainnet10")
#: catalog entries read from their binary record files
CIFAR_DATASETS = tuple(cifar.LAYOUTS)
#: every catalog entry :func:`load_catalog` can run
RUNNABLE = (
    pacs.NAME,
    *FOLDER_DATASETS,
    *DOMAINNET_DATASETS,
    *CIFAR_DATASETS,
    *elcfs_sets.SETS,
    digit_five.NAME,
)
USER_LIST = "{domain}_{split}.txt"


def _domain_dir(entry: CatalogEntry, root: Path, domain: str) -> Path:
    """Where ``domain``'s class folders lie (Office-31 may nest them under ``images/``)."""
    base = root / entry.image_subdir if entry.image_subdir else root
    if not base.is_dir():
        base = root
    folder = base / domain
    if not folder.is_dir():
        raise DatasetError(f"missing domain folder {folder} (expected {entry.layout})")
    nested = folder / "images"
    if entry.name == "office31" and nested.is_dir():
        return nested
    return folder


def _seed(seed: int, domain: str) -> int:
    """A per-domain holdout seed: the split of one domain does not depend on the others."""
    return (int(seed) * 1_000_003 + sum(ord(c) * 31**i for i, c in enumerate(domain))) % 2**32


def _domain_holdout(seed: int) -> Callable[[list, str], tuple[list, list]]:
    """``(entries, domain) -> (train, val)``: the seeded ``VAL_FRACTION`` holdout of a domain."""
    return lambda entries, domain: holdout(entries, VAL_FRACTION, _seed(seed, domain))


def _holdout_splits(entries: list[Entry], seed: int, domain: str) -> dict[str, list[Entry]]:
    train, val = _domain_holdout(seed)(entries, domain)
    return {"train": train, "val": val}


def _domainnet_classes(entry: CatalogEntry, root: Path) -> list[str]:
    if entry.classes:
        return list(entry.classes)
    lists = [root / p.format(d=d) for d in entry.domains for p in entry.list_pattern]
    for path in lists:
        if not path.is_file():
            raise DatasetError(f"missing split list {path} (expected {entry.layout})")
    return list_classes(lists)


def _official_splits(
    entry: CatalogEntry, root: Path, classes: list[str], seed: int
) -> tuple[dict[str, dict[str, list[Entry]]], str]:
    """Domain -> split -> entries following the entry's own split, and its description."""
    if entry.name == pacs.NAME:
        return pacs.split_entries(root), (
            "official kfold lists (train, crossval as val, test = the whole domain)"
        )
    out = {}
    if entry.name in DOMAINNET_DATASETS:
        keep = {c: i for i, c in enumerate(classes)} if entry.classes else None
        for domain in entry.domains:
            _domain_dir(entry, root, domain)
            train, test = (
                read_split_list(
                    root / p.format(d=domain), root, classes, layout=entry.layout, keep=keep
                )
                for p in entry.list_pattern
            )
            out[domain] = {**_holdout_splits(train, seed, domain), "test": test}
        subset = " restricted to FedBN's 10 classes" if entry.classes else ""
        return out, (
            f"official train/test lists{subset}; val: a seeded stratified {VAL_FRACTION:g} of "
            f"the train list (split_seed={seed}); test: the test list"
        )
    for domain in entry.domains:
        everything = folder_entries(_domain_dir(entry, root, domain), classes)
        out[domain] = {**_holdout_splits(everything, seed, domain), "test": everything}
    return out, (
        f"DomainBed holdout: per domain a seeded stratified {1 - VAL_FRACTION:g}/"
        f"{VAL_FRACTION:g} train/val split (split_seed={seed}); test: the whole domain"
    )


def _user_splits(
    entry: CatalogEntry, root: Path, classes: list[str], seed: int, folder: Path
) -> tuple[dict[str, dict[str, list[Entry]]], str]:
    """Domain -> split -> entries from the user's ``<domain>_<split>.txt`` lists in ``folder``."""
    if not folder.is_dir():
        raise DatasetError(f"split_files folder {folder} does not exist")
    images = pacs.image_root(root) if entry.name == pacs.NAME else root
    layout = f"{folder}/<domain>_{{train,val,test}}.txt, '<path under {images}> <0-based label>'"
    out = {}
    for domain in entry.domains:
        _domain_dir(entry, root, domain)
        read = {
            split: read_split_list(
                folder / USER_LIST.format(domain=domain, split=split),
                images,
                classes,
                layout=layout,
            )
            for split in ("train", "test")
        }
        val_list = folder / USER_LIST.format(domain=domain, split="val")
        if val_list.is_file():
            read["val"] = read_split_list(val_list, images, classes, layout=layout)
        else:
            read.update(_holdout_splits(read["train"], seed, domain))
        out[domain] = read
    return out, (
        f"user split lists from {folder.resolve()} (val: the list, or a seeded stratified "
        f"{VAL_FRACTION:g} of the train list where none is given, split_seed={seed})"
    )


def _classes(entry: CatalogEntry, root: Path) -> list[str]:
    if entry.name in DOMAINNET_DATASETS:
        return _domainnet_classes(entry, root)
    if entry.classes:
        return list(entry.classes)
    return class_folders([_domain_dir(entry, root, d) for d in entry.domains])


def load_catalog(
    name: str,
    root: str | os.PathLike,
    *,
    image_size: int | None = None,
    seed: int = 0,
    split_files: str | os.PathLike = "",
    domains: list[str] | None = None,
    cache_dir: str | os.PathLike | None = None,
    cache: bool = True,
) -> DomainDataset:
    """Catalog entry ``name`` read from ``root``, decoded at its resolution (or
    ``image_size``), split as the entry states or by the lists in ``split_files``.

    Decoded images live in the image cache under ``cache_dir`` (default ``$FEDSHIFT_CACHE``
    or ``~/.cache/fedshift``), memory-mapped; ``cache=False`` decodes them into memory.

    ``domains``: decode only these (the whole copy is still checked); unknown names are
    left for :func:`~fedshift.data.registry.restrict_domains` to report."""
    if name not in RUNNABLE:
        raise DatasetError(
            f"catalog dataset {name!r} cannot be run; runnable: {', '.join(RUNNABLE)}"
        )
    entry = CATALOG[name]
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DatasetError(f"dataset root {root} does not exist (expected {entry.layout})")
    size = entry.resolution if image_size is None else int(image_size)
    meta = {
        "source": name,
        "root": str(root.resolve()),
        "layout": entry.layout,
        "split_seed": int(seed),
        "split_files": str(split_files),
    }
    if split_files and (name in CIFAR_DATASETS or name == digit_five.NAME):
        raise DatasetError(f"split_files does not apply to {name}: it has official files")
    if name == digit_five.NAME:
        return digit_five.load_digit_five(
            root,
            image_size=size,
            seed=seed,
            holdout=_domain_holdout(seed),
            val_fraction=VAL_FRACTION,
            meta=meta,
            domains=domains,
            cache_folder=image_cache.cache_folder(cache_dir) if cache else None,
        )
    if name in CIFAR_DATASETS:
        return cifar.load_cifar(
            name,
            root,
            image_size=size,
            seed=seed,
            holdout=_domain_holdout(seed),
            val_fraction=VAL_FRACTION,
            meta=meta,
        )
    if name in elcfs_sets.SETS:
        if split_files:
            raise DatasetError(f"split_files does not apply to {name}: it is split per site")
        return elcfs_sets.load_elcfs(
            name,
            root,
            image_size=size,
            site_seed=_seed,
            seed=seed,
            meta=meta,
            cache_folder=image_cache.cache_folder(cache_dir) if cache else None,
            domains=domains,
        )
    classes = _classes(entry, root)
    if split_files:
        splits, description = _user_splits(
            entry, root, classes, seed, Path(split_files).expanduser()
        )
    else:
        splits, description = _official_splits(entry, root, classes, seed)
    if domains is not None:
        splits = {d: parts for d, parts in splits.items() if d in domains}
    return decode_dataset(
        name,
        splits,
        classes,
        size,
        {
            **meta,
            "split": description,
            "augment": "domainbed",  # the training augmentation `augment=auto` picks
        },
        cache_folder=image_cache.cache_folder(cache_dir) if cache else None,
    )
