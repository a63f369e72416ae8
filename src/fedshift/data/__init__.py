"""Data layer: domains, the offline ``digits-dg`` dataset, folder datasets, partitioners."""

from fedshift.data.custom import make_dataset, register_dataset
from fedshift.data.domains import DatasetError, Domain, DomainDataset, Split
from fedshift.data.folder import load_folder_dataset
from fedshift.data.partition import ClientSpec, partition_domains
from fedshift.data.preview import save_sample_grid
from fedshift.data.registry import DATASETS, describe_datasets, load_dataset

__all__ = [
    "DATASETS",
    "ClientSpec",
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
