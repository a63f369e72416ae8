"""What every catalog dataset is (:class:`CatalogDataset`: its card, ``check(root)`` and
``load(root, options)``) and the pieces several share: the seeded per-domain holdout, a
domain whose train and val splits are views of one array, and :class:`ImageListDataset`, the
datasets read as ``(image file, label)`` entries (official lists or class folders) that also
take the user's own split lists (``split_files=DIR``: ``<domain>_{train,val,test}.txt``,
``<relative path> <label>`` lines, paths relative to the dataset's image root, 0-based labels
in its class order; without a val list, val is the seeded holdout of the train list).

A dataset with no official test part (:attr:`CatalogDataset.whole_domain_test`: the class
folders, PACS, Camelyon17, the ELCFS sites) tests on the whole domain, right for a held-out
target; loaded for a protocol whose scored domains also train (``held_out_test``), it holds
out a test part instead, disjoint from train and val: :func:`split_off_test`, FPL's official
Office-Caltech10 rule.

Checking and loading take the domains to use (``NAME:dom1,dom2``): only their files are
looked at, so a user holding one domain of a multi-domain copy can check and run it; with no
domains named, the whole copy is checked and read."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from fedshift.core.errors import did_you_mean
from fedshift.data.domains import DatasetError, Domain, DomainDataset
from fedshift.data.formats.images import verify_images
from fedshift.data.lists import (
    SPLITS,
    VAL_FRACTION,
    Entry,
    decode_dataset,
    held_out_count,
    holdout,
)
from fedshift.data.lists import read_split_list as read_list

if TYPE_CHECKING:  # torch loads only when data is read, not to list or describe it
    import torch

    from fedshift.core.split import Split


Counts = dict[str, dict[str, int]]
Splits = dict[str, dict[str, list[Entry]]]
USER_LIST = "{domain}_{split}.txt"
#: up to how many fixed classes ``datasets list`` names one by one
LISTED_CLASSES = 12


@dataclass(frozen=True)
class LoadOptions:
    """How to load a catalog dataset: ``image_size`` (None: its own resolution),
    ``split_seed``, the user's ``split_files`` folder ("" for the dataset's own split),
    ``domains`` to check and decode (None: all; :meth:`CatalogDataset.load` passes them on
    checked, as :meth:`CatalogDataset.pick_domains` returns them), the image cache folder
    (None: decode into memory), ``catalog_split`` and ``held_out_test``."""

    image_size: int | None = None
    seed: int = 0
    split_files: str = ""
    domains: Sequence[str] | None = None
    cache_folder: Path | None = None
    #: ``full``: the whole official train and test files where the entry's default protocol
    #: samples them down (Digit-Five's KD3A/FACT 25,000 / 9,000); ``default``: as the entry says
    catalog_split: str = "default"
    #: the domains also train and are scored (protocols per-domain, personalized): where the
    #: dataset's test split is the whole domain (:attr:`CatalogDataset.whole_domain_test`),
    #: hold out a test part by :func:`split_off_test` and take it out of train and val
    held_out_test: bool = False


@dataclass(frozen=True, kw_only=True)
class CatalogDataset(ABC):
    """One dataset as its authors distribute it: its card and how to check and load a copy."""

    name: str
    source: str  # who published it
    layout: str  # the files under ROOT
    split: str  # how train / val / test are made
    domains: tuple[str, ...]
    resolution: int  # the side images are decoded to unless image_size says otherwise
    description: str  # one line for `datasets list` and the --dataset help
    class_source: str  # where the classes and their label order come from
    official_totals: Mapping[str, int] = field(default_factory=dict)  # images per domain
    classes: tuple[str, ...] = ()  # in label order; empty: read from the copy
    augment: str = "none"  # the training augmentation `augment=auto` picks
    own_split: str = ""  # non-empty: why split_files does not apply
    #: its test split is the whole domain (no official test part): a held-out target is scored
    #: on every image; under ``held_out_test`` a test part is held out (:func:`split_off_test`)
    whole_domain_test: bool = False
    #: its protocol samples the official files down, and ``catalog_split=full`` reads them
    #: whole; elsewhere ``full`` would change nothing, so it is refused
    samples_down: bool = False

    def check(
        self, root: str | os.PathLike, domains: Sequence[str] | None = None
    ) -> tuple[Counts, list[str]]:
        """(domain -> split -> images, one-line warnings where a count differs from the
        official copy's) of ``domains`` (None: every domain); only their files are read. A
        missing or malformed copy, or an unknown domain, raises a one-line DatasetError."""
        picked = self.pick_domains(domains)
        return self.count(self.root(root), picked)

    def load(self, root: str | os.PathLike, options: LoadOptions) -> DomainDataset:
        """The copy at ``root`` as a :class:`DomainDataset`, split as :attr:`split` states
        (or by the user's ``split_files``); only ``options.domains`` (None: all) are read."""
        options = replace(options, domains=self.pick_domains(options.domains))
        root = self.root(root)
        if options.split_files and self.own_split:
            raise DatasetError(f"split_files does not apply to {self.name}: {self.own_split}")
        if isinstance(options.image_size, bool) or (
            options.image_size is not None and int(options.image_size) < 1
        ):
            raise DatasetError(f"image_size must be a positive integer, got {options.image_size!r}")
        return self.read(root, options)

    @abstractmethod
    def count(self, root: Path, domains: tuple[str, ...]) -> tuple[Counts, list[str]]:
        """:meth:`check` of ``domains`` (as :meth:`pick_domains` returns them) on an
        existing root folder."""

    @abstractmethod
    def read(self, root: Path, options: LoadOptions) -> DomainDataset:
        """:meth:`load` on an existing root folder, with checked options (``domains`` as
        :meth:`pick_domains` returns them)."""

    def pick_domains(self, names: Sequence[str] | None) -> tuple[str, ...]:
        """The domains to check and read: every domain of the card for None, else ``names``
        in their order; an empty or repeating list, or a name not on the card, raises one
        line naming the valid domains (and the closest one)."""
        if names is None:
            return self.domains
        names = listed_domains(self.name, names, self.domains)
        for name in names:
            if name not in self.domains:
                raise DatasetError(
                    f"unknown domain {name!r} of {self.name}"
                    f"{did_you_mean(name, self.domains)}; its domains: {', '.join(self.domains)}"
                )
        return names

    def root(self, root: str | os.PathLike) -> Path:
        """``root`` as a path; a missing folder raises naming the expected layout."""
        path = Path(root).expanduser()
        if not path.is_dir():
            raise DatasetError(f"dataset root {path} does not exist (expected {self.layout})")
        return path

    def size(self, options: LoadOptions) -> int:
        return self.resolution if options.image_size is None else int(options.image_size)

    def meta(self, root: Path, options: LoadOptions) -> dict:
        """The provenance every loaded copy records; ``test_is_domain``: every domain's test
        split is the whole domain (so it holds the domain's train and val images)."""
        return {
            "source": self.name,
            "root": str(root.resolve()),
            "layout": self.layout,
            "split_seed": int(options.seed),
            "split_files": str(options.split_files),
            "test_is_domain": self.holds_whole_domain_test(options),
        }

    def holds_whole_domain_test(self, options: LoadOptions) -> bool:
        """Whether a load with ``options`` tests every domain on all its images."""
        return self.whole_domain_test and not options.held_out_test and not options.split_files

    def total_warnings(self, totals: Mapping[str, int]) -> list[str]:
        """One line per domain of ``totals`` whose image count differs from
        :attr:`official_totals`."""
        return [
            f"{self.name}/{domain}: {totals[domain]} images, the official copy has {official}"
            for domain, official in self.official_totals.items()
            if domain in totals and totals[domain] != official
        ]

    def class_line(self) -> str:
        """The classes in label order (where the card fixes them) and their source: the
        ``classes:`` line of ``datasets list``."""
        if self.classes and len(self.classes) <= LISTED_CLASSES:
            return f"{', '.join(self.classes)}; {self.class_source}"
        return self.class_source

    def domain_line(self) -> str:
        """The ``domains:`` line of ``datasets list``: the domains, by name."""
        return ", ".join(self.domains)


def listed_domains(dataset: str, names: Sequence[str], valid: Sequence[str]) -> tuple[str, ...]:
    """``names`` as a tuple; an empty or repeating list raises naming the valid domains."""
    names = tuple(names)
    known = ", ".join(valid) or "the writers of the copy"
    if not names:
        raise DatasetError(f"no domains listed after '{dataset}:'; its domains: {known}")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise DatasetError(f"domain {repeated[0]!r} is listed twice in {dataset}:{','.join(names)}")
    return names


def domain_seed(seed: int, domain: str) -> int:
    """A per-domain holdout seed: the split of one domain does not depend on the others."""
    return (int(seed) * 1_000_003 + sum(ord(c) * 31**i for i, c in enumerate(domain))) % 2**32


def domain_holdout(entries: Sequence, seed: int, domain: str) -> tuple[list, list]:
    """(train, val): the seeded stratified ``VAL_FRACTION`` holdout of a domain's entries."""
    return holdout(entries, VAL_FRACTION, domain_seed(seed, domain))


#: a domain that trains and is scored keeps, of every ``TEST_BLOCK`` images in its order, those
#: from ``TEST_FROM`` on for test: FPL's official Office-Caltech10 rule (``i % 10 > 7``, 20 %)
TEST_BLOCK = 10
TEST_FROM = 8
HELD_OUT_TEST = (
    f"a held-out part, as the domain also trains: image i of the domain, in the order its "
    f"whole-domain test lists it, when i % {TEST_BLOCK} >= {TEST_FROM} (FPL's official "
    f"rule, {1 - TEST_FROM / TEST_BLOCK:.0%}), taken out of train and val"
)


def split_off_test(items: Sequence) -> tuple[list, list]:
    """(rest, test) of a domain's items in its canonical order: item ``i`` is a test item when
    ``i % TEST_BLOCK >= TEST_FROM``, the last 2 of every 10 (FPL's official Office-Caltech10
    split, ``ImageFolder_Custom``: ``i % 10 <= 7`` trains). Deterministic, no seed: a
    domain's test images are the same for every run and every ``split_seed``."""
    rest = [item for i, item in enumerate(items) if i % TEST_BLOCK < TEST_FROM]
    test = [item for i, item in enumerate(items) if i % TEST_BLOCK >= TEST_FROM]
    return rest, test


def check_held_out(dataset: str, domain: str, total: int, test: Sequence) -> None:
    """A domain too small to hold out a test image (8 images or fewer) raises one line."""
    if not test:
        raise DatasetError(
            f"{dataset}/{domain} has {total} images, too few to hold out a test part "
            f"(images {TEST_FROM}..{TEST_BLOCK - 1} of every {TEST_BLOCK} become test images)"
        )


def hold_out_test(dataset: str, splits: Splits) -> Splits:
    """``splits`` (each domain's test list the whole domain) with a test part held out by
    :func:`split_off_test` over the test list's order, and those images taken out of train
    and val: the other images keep the split they had."""
    out = {}
    for domain, parts in splits.items():
        _, test = split_off_test(parts["test"])
        check_held_out(dataset, domain, len(parts["test"]), test)
        held = {path for path, _ in test}
        out[domain] = {
            "train": [e for e in parts["train"] if e[0] not in held],
            "val": [e for e in parts["val"] if e[0] not in held],
            "test": test,
        }
    return out


def holdout_counts(class_sizes: Sequence[int]) -> dict[str, int]:
    """The train / val / test sizes a holdout gives a domain with ``class_sizes`` (val:
    ``VAL_FRACTION`` of each class; test: the whole domain)."""
    held = sum(held_out_count(n, VAL_FRACTION) for n in class_sizes)
    total = sum(class_sizes)
    return {"train": total - held, "val": held, "test": total}


def pooled_domain(
    name: str,
    pixels: torch.Tensor,
    labels: torch.Tensor,
    cut: int,
    test: Split | None = None,
    masks: torch.Tensor | None = None,
    test_from: int | None = None,
) -> Domain:
    """A domain whose train split is rows ``[:cut]`` and val rows ``[cut:]`` of one array
    (views, no copy); test is ``test``, or the whole array. With ``test_from``, val is rows
    ``[cut:test_from]`` and test rows ``[test_from:]`` (a held-out test part)."""
    from fedshift.core.split import Split

    def rows(start: int, stop: int | None) -> Split:
        mask = None if masks is None else masks[start:stop]
        return Split(x=pixels[start:stop], y=labels[start:stop], mask=mask)

    if test_from is not None:
        return Domain(
            name=name, train=rows(0, cut), val=rows(cut, test_from), test=rows(test_from, None)
        )
    return Domain(
        name=name,
        train=rows(0, cut),
        val=rows(cut, None),
        test=Split(x=pixels, y=labels, mask=masks) if test is None else test,
    )


@dataclass(frozen=True, kw_only=True)
class ImageListDataset(CatalogDataset):
    """A dataset of image files, each split a list of ``(file, label)`` entries decoded once
    into the image cache; the user may replace the split by their own lists."""

    augment: str = "domainbed"

    def image_root(self, root: Path) -> Path:
        """Where the domain folders lie (and the paths of split lists start)."""
        return root

    def domain_dir(self, root: Path, domain: str) -> Path:
        """The folder of ``domain``; a missing one raises."""
        folder = self.image_root(root) / domain
        if not folder.is_dir():
            raise DatasetError(f"missing domain folder {folder} (expected {self.layout})")
        return folder

    @abstractmethod
    def class_names(self, root: Path, domains: Sequence[str]) -> list[str]:
        """The classes in label order (read from ``domains``' files where the card does not
        fix them)."""

    @abstractmethod
    def official_splits(
        self, root: Path, classes: list[str], seed: int, domains: Sequence[str]
    ) -> tuple[Splits, str]:
        """Domain -> split -> entries of ``domains`` as :attr:`split` states, and its
        description."""

    def user_splits(
        self, root: Path, classes: list[str], seed: int, folder: Path, domains: Sequence[str]
    ) -> tuple[Splits, str]:
        """Domain -> split -> entries of ``domains`` from the user's ``<domain>_<split>.txt``
        lists."""
        if not folder.is_dir():
            raise DatasetError(f"split_files folder {folder} does not exist")
        images = self.image_root(root)
        layout = (
            f"{folder}/<domain>_{{train,val,test}}.txt, '<path under {images}> <0-based label>'"
        )
        out = {}
        for domain in domains:
            self.domain_dir(root, domain)
            read = {
                split: read_list(
                    folder / USER_LIST.format(domain=domain, split=split),
                    images,
                    classes,
                    layout=layout,
                )
                for split in ("train", "test")
            }
            val_list = folder / USER_LIST.format(domain=domain, split="val")
            if val_list.is_file():
                read["val"] = read_list(val_list, images, classes, layout=layout)
            else:
                read["train"], read["val"] = domain_holdout(read["train"], seed, domain)
            out[domain] = {s: read[s] for s in ("train", "val", "test")}
        return out, (
            f"user split lists from {folder.resolve()} (val: the list, or a seeded stratified "
            f"{VAL_FRACTION:g} of the train list where none is given, split_seed={seed})"
        )

    def count(self, root: Path, domains: tuple[str, ...]) -> tuple[Counts, list[str]]:
        """The official split a run would read, checked the way a run reads it (every listed
        file present, every label in range, naming list and line) plus every image's header
        opened (no decoding); a domain's total is its distinct images."""
        splits, _ = self.official_splits(root, self.class_names(root, domains), 0, domains)
        images = {
            domain: {path for entries in parts.values() for path, _ in entries}
            for domain, parts in splits.items()
        }
        verify_images(sorted(set().union(*images.values())))
        counts = {d: {s: len(parts[s]) for s in SPLITS} for d, parts in splits.items()}
        return counts, self.total_warnings({d: len(paths) for d, paths in images.items()})

    def read(self, root: Path, options: LoadOptions) -> DomainDataset:
        domains = self.domains if options.domains is None else options.domains
        classes = self.class_names(root, domains)
        if options.split_files:
            folder = Path(options.split_files).expanduser()
            splits, description = self.user_splits(root, classes, options.seed, folder, domains)
        else:
            splits, description = self.official_splits(root, classes, options.seed, domains)
            if self.whole_domain_test and options.held_out_test:
                splits = hold_out_test(self.name, splits)
                description = f"{description}; instead, test: {HELD_OUT_TEST}"
        return decode_dataset(
            self.name,
            splits,
            classes,
            self.size(options),
            {**self.meta(root, options), "split": description, "augment": self.augment},
            cache_folder=options.cache_folder,
        )
