"""Data layer: domains, the offline ``digits-dg`` dataset, folder datasets, partitioners.

The names below are imported on first use (most need torch), so a module of this package,
``fedshift.data.catalog`` or ``fedshift.data.partitioners``, loads without the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedshift.data.custom import make_dataset, register_dataset
    from fedshift.data.domains import DatasetError, Domain, DomainDataset, Split
    from fedshift.data.folder import load_folder_dataset
    from fedshift.data.partition import ClientSpec, partition_domains
    from fedshift.data.preview import save_sample_grid
    from fedshift.data.registry import DATASETS, describe_datasets, load_dataset

#: public name -> the module that defines it
_HOMES = {
    "make_dataset": "fedshift.data.custom",
    "register_dataset": "fedshift.data.custom",
    "DatasetError": "fedshift.data.domains",
    "Domain": "fedshift.data.domains",
    "DomainDataset": "fedshift.data.domains",
    "Split": "fedshift.data.domains",
    "load_folder_dataset": "fedshift.data.folder",
    "ClientSpec": "fedshift.data.partition",
    "partition_domains": "fedshift.data.partition",
    "save_sample_grid": "fedshift.data.preview",
    "DATASETS": "fedshift.data.registry",
    "describe_datasets": "fedshift.data.registry",
    "load_dataset": "fedshift.data.registry",
}

__all__ = [
    "ClientSpec",
    "DATASETS",
    "DatasetError",
    "Domain",
    "DomainDataset",
    "Split",
    "describe_datasets",
    "load_dataset",
    "load_folder_dataset",
    "make_dataset",
    "partition_domains",
    "register_dataset",
    "save_sample_grid",
]


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'fedshift.data' has no attribute {name!r}")
