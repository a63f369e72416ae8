"""The dataset catalog: the field's datasets read as their authors distribute them, one
module per dataset family behind :class:`~fedshift.data.catalog.base.CatalogDataset`.

The registry is the one table :data:`CATALOG` below: adding a dataset is one module (its
:class:`CatalogDataset` instance) plus one line in ``_ENTRIES``.

* ``check_dataset(name, root)`` validates a user's copy against the layout its authors
  distribute and returns the per-domain, per-split image counts plus one-line warnings where
  a count differs from the official one. It reads directory listings, split lists and file
  headers, so it is cheap on DomainNet-sized trees. ``NAME:dom1,dom2`` (see
  :func:`split_name`) checks only those domains' files, as a run on them reads them.
* ``load_catalog(name, root, ...)`` loads a copy (``fedshift run -d NAME --set
  data_root=PATH``) with the split its entry states, or the user's own lists
  (``split_files=DIR``) where the dataset takes them.
"""

from __future__ import annotations

import os

from fedshift.core.errors import did_you_mean
from fedshift.data import image_cache
from fedshift.data.catalog import (
    camelyon17,
    cifar,
    class_folders,
    digit_five,
    domainnet,
    elcfs,
    femnist,
    pacs,
)
from fedshift.data.catalog.base import CatalogDataset, Counts, LoadOptions
from fedshift.data.catalog.class_folders import ClassFolderDataset
from fedshift.data.catalog.domainnet import DOMAINNET10_CLASSES
from fedshift.data.domains import DatasetError, DomainDataset

_ENTRIES: tuple[CatalogDataset, ...] = (
    pacs.PACS,
    class_folders.OFFICE_HOME,
    class_folders.VLCS,
    class_folders.TERRA_INCOGNITA,
    domainnet.DOMAINNET,
    domainnet.DOMAINNET10,
    class_folders.OFFICE_CALTECH10,
    class_folders.OFFICE31,
    cifar.CIFAR10,
    cifar.CIFAR100,
    digit_five.DIGIT_FIVE,
    elcfs.FUNDUS,
    elcfs.PROSTATE,
    camelyon17.CAMELYON17,
    femnist.FEMNIST,
)
#: name -> dataset, in the order ``datasets list`` shows them
CATALOG: dict[str, CatalogDataset] = {entry.name: entry for entry in _ENTRIES}
#: every catalog entry :func:`load_catalog` can run
RUNNABLE = tuple(CATALOG)
#: catalog entries read from ``ROOT/<domain>/<class>/<image>`` with a seeded holdout
FOLDER_DATASETS = tuple(n for n, e in CATALOG.items() if isinstance(e, ClassFolderDataset))

__all__ = [
    "CATALOG",
    "DOMAINNET10_CLASSES",
    "FOLDER_DATASETS",
    "RUNNABLE",
    "CatalogDataset",
    "LoadOptions",
    "check_dataset",
    "load_catalog",
    "split_name",
]


def _entry(name: str) -> CatalogDataset:
    if name not in CATALOG:
        raise DatasetError(
            f"unknown dataset {name!r}{did_you_mean(name, CATALOG)}; the catalog has "
            f"{', '.join(CATALOG)}"
        )
    return CATALOG[name]


def full_split_refusal(name: str) -> str:
    """Why ``catalog_split=full`` does not apply to dataset ``name``, in one line."""
    honoured = ", ".join(n for n, entry in CATALOG.items() if entry.samples_down)
    return (
        f"catalog_split=full applies to the catalog entries whose protocol samples the "
        f"official files down ({honoured}), not to {name!r}; leave catalog_split=default"
    )


def split_name(text: str) -> tuple[str, list[str] | None]:
    """``NAME:dom1,dom2`` -> (``NAME``, [dom1, dom2]); a name without ``:`` -> (it, None).
    Blank entries are dropped (``NAME:`` lists none, which checking refuses)."""
    name, sep, tail = text.partition(":")
    if not sep:
        return text, None
    return name, [d.strip() for d in tail.split(",") if d.strip()]


def check_dataset(
    name: str, root: str | os.PathLike, domains: list[str] | None = None
) -> tuple[Counts, list[str]]:
    """Validate ``root`` as catalog entry ``name``: (per-domain per-split counts, warnings)
    of ``domains`` (None: every domain; only their files are read)."""
    return _entry(name).check(root, domains)


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
    catalog_split: str = "default",
    held_out_test: bool = False,
) -> DomainDataset:
    """Catalog entry ``name`` read from ``root``, decoded at its resolution (or
    ``image_size``), split as the entry states or by the lists in ``split_files``.

    Decoded images live in the image cache under ``cache_dir`` (default ``$FEDSHIFT_CACHE``
    or ``~/.cache/fedshift``), memory-mapped; ``cache=False`` decodes them into memory.

    ``domains``: check and decode only these (their files alone need be there); an unknown
    name raises naming the valid ones. ``catalog_split``: ``full`` reads the whole official
    files where the entry samples them down (Digit-Five). ``held_out_test``: the domains
    also train and are scored (per-domain, personalized), so an entry whose test split is
    the whole domain holds out a test part instead (FPL's rule, 20 %; see
    :func:`~fedshift.data.catalog.base.split_off_test`)."""
    entry = _entry(name)
    if catalog_split != "default" and not entry.samples_down:
        raise DatasetError(full_split_refusal(name))
    options = LoadOptions(
        image_size=image_size,
        seed=int(seed),
        split_files=str(split_files),
        domains=domains,
        cache_folder=image_cache.cache_folder(cache_dir) if cache else None,
        catalog_split=catalog_split,
        held_out_test=held_out_test,
    )
    return entry.load(root, options)
