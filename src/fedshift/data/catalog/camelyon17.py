"""Camelyon17-WILDS v1.0 (Koh et al., ICML 2021; Bandi et al., IEEE TMI 2019): 96x96 RGB
patches of lymph-node whole-slide images from 5 hospitals, labelled by whether the central
region holds tumor tissue, read in WILDS's release layout.

Layout: ``ROOT/metadata.csv`` (columns ``patient, node, x_coord, y_coord, tumor, slide,
center, split``, WILDS's unnamed index column first) and the patches at
``ROOT/patches/patient_{patient:03d}_node_{node}/patch_patient_{patient:03d}_node_{node}_x_{x}_y_{y}.png``.

Protocol (FedDG-Benchmark's): the hospitals ``center`` 0..4 are the domains ``hospital0`` ..
``hospital4``; 2 classes (``tumor`` 0 / 1). Per domain, train / val follow WILDS's ``split``
column (0 train, 1 val) where the domain has val rows, else a seeded stratified 0.2 of its
rows (``split_seed``) is val; test is the whole domain, so a held-out target hospital is
scored on all its patches (as PACS's test_kfold). Loaded for a protocol whose scored domains
also train (``held_out_test``), a hospital's test split is instead its patch ``i`` in
``metadata.csv`` order when ``i % 10 > 7`` (FPL's rule, 20 %), those patches leaving train
and val.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fedshift.core.bounded import open_text
from fedshift.data.catalog.base import (
    ImageListDataset,
    Splits,
    domain_holdout,
)
from fedshift.data.domains import DatasetError
from fedshift.data.lists import VAL_FRACTION, Entry

METADATA = "metadata.csv"
COLUMNS = ("patient", "node", "x_coord", "y_coord", "tumor", "slide", "center", "split")
PATCH = (
    "patches/patient_{patient:03d}_node_{node}/"
    "patch_patient_{patient:03d}_node_{node}_x_{x}_y_{y}.png"
)
HOSPITALS = tuple(f"hospital{c}" for c in range(5))


@dataclass(frozen=True)
class _Row:
    """One patch of the metadata: where it lies, its label, hospital and WILDS split."""

    path: Path
    label: int
    center: int
    split: int


def _integer(text: str, where: str, column: str, allowed: range | None = None) -> int:
    value = text.strip()
    if not value.lstrip("-").isdigit():
        raise DatasetError(f"{where}: column {column} is {text!r}, not an integer")
    number = int(value)
    if allowed is not None and number not in allowed:
        raise DatasetError(
            f"{where}: {column} {number} is not in {allowed.start}..{allowed.stop - 1}"
        )
    return number


def _read_metadata(root: Path, layout: str, domains: Sequence[str] = HOSPITALS) -> list[_Row]:
    """The rows of ``metadata.csv`` whose hospital is one of ``domains``; every row checked
    (header, integer columns, label, center and split ranges) and each kept row's patch
    found (one directory listing per folder): the patches of other hospitals need not be
    there."""
    centers = {HOSPITALS.index(d) for d in domains}
    path = root / METADATA
    if not path.is_file():
        raise DatasetError(f"missing {path} (expected {layout})")
    rows = []
    listings: dict[Path, frozenset[str]] = {}
    with open_text(path, DatasetError, "metadata file", newline="") as handle:
        reader = csv.reader(handle)
        header = [h.strip() for h in next(reader, [])]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise DatasetError(
                f"{path.name} line 1: header lacks column(s) {', '.join(missing)} "
                f"(expected {', '.join(COLUMNS)})"
            )
        index = {c: header.index(c) for c in COLUMNS}
        for number, fields in enumerate(reader, start=2):
            if not fields:
                continue
            where = f"{path.name} line {number}"
            if len(fields) != len(header):
                raise DatasetError(f"{where}: {len(fields)} fields, the header has {len(header)}")
            value = {c: fields[i] for c, i in index.items()}
            patient = _integer(value["patient"], where, "patient")
            node = _integer(value["node"], where, "node")
            x, y = (
                _integer(value["x_coord"], where, "x_coord"),
                _integer(value["y_coord"], where, "y_coord"),
            )
            label = _integer(value["tumor"], where, "tumor", range(2))
            center = _integer(value["center"], where, "center", range(len(HOSPITALS)))
            split = _integer(value["split"], where, "split", range(2))
            if center not in centers:
                continue
            patch = root / PATCH.format(patient=patient, node=node, x=x, y=y)
            folder = patch.parent
            if folder not in listings:
                listings[folder] = frozenset(os.listdir(folder)) if folder.is_dir() else frozenset()
            if patch.name not in listings[folder]:
                raise DatasetError(f"{where} names a missing file {patch}")
            rows.append(_Row(patch, label, center, split))
    if not rows and len(centers) == len(HOSPITALS):
        raise DatasetError(f"{path} lists no patch (expected {layout})")
    return rows


def _by_domain(rows: list[_Row], domains: Sequence[str]) -> dict[str, list[_Row]]:
    out: dict[str, list[_Row]] = {h: [] for h in domains}
    for row in rows:
        out[HOSPITALS[row.center]].append(row)
    return out


@dataclass(frozen=True, kw_only=True)
class Camelyon17Dataset(ImageListDataset):
    """Camelyon17-WILDS: hospitals as domains, WILDS's train / val split, test = domain."""

    whole_domain_test: bool = True

    def image_root(self, root: Path) -> Path:
        return root

    def domain_dir(self, root: Path, domain: str) -> Path:
        """The patches folder (all hospitals share it; the metadata says whose a patch is)."""
        folder = root / "patches"
        if not folder.is_dir():
            raise DatasetError(f"missing folder {folder} (expected {self.layout})")
        return folder

    def class_names(self, root: Path, domains: Sequence[str]) -> list[str]:
        return list(self.classes)

    def official_splits(
        self, root: Path, classes: list[str], seed: int, domains: Sequence[str]
    ) -> tuple[Splits, str]:
        self.domain_dir(root, HOSPITALS[0])
        out = {}
        for domain, rows in _by_domain(_read_metadata(root, self.layout, domains), domains).items():
            if not rows:
                raise DatasetError(f"{METADATA} lists no patch of {domain}")
            entries: list[Entry] = [(r.path, r.label) for r in rows]
            val = [(r.path, r.label) for r in rows if r.split == 1]
            if val:
                train = [(r.path, r.label) for r in rows if r.split == 0]
            else:
                train, val = domain_holdout(entries, seed, domain)
            out[domain] = {"train": train, "val": val, "test": entries}
        return out, (
            "WILDS's split column per hospital (0 train, 1 val; a hospital without val rows: "
            f"a seeded stratified {VAL_FRACTION:g} of it, split_seed={seed}); test: the whole "
            "hospital"
        )


CAMELYON17 = Camelyon17Dataset(
    name="camelyon17",
    source="Camelyon17-WILDS v1.0 (Koh et al., ICML 2021; Bandi et al., TMI 2019)",
    layout=(
        "ROOT/metadata.csv (patient, node, x_coord, y_coord, tumor, slide, center, split) + "
        "ROOT/patches/patient_{patient:03d}_node_{node}/"
        "patch_patient_{patient:03d}_node_{node}_x_{x}_y_{y}.png"
    ),
    split=(
        "hospitals (center 0..4) as domains; train/val by WILDS's split column (a seeded 0.2 "
        "holdout where a hospital has no val rows); test: the whole hospital; a hospital that "
        "also trains: i % 10 > 7 of its patches held out as test (FPL's rule)"
    ),
    domains=HOSPITALS,
    resolution=96,
    official_totals={
        "hospital0": 59436,
        "hospital1": 34904,
        "hospital2": 85054,
        "hospital3": 129838,
        "hospital4": 146722,
    },
    classes=("normal", "tumor"),
    augment="none",
    description="96 px lymph-node patches, tumor or not, from 5 hospitals",
    class_source="metadata.csv's tumor column: 0 normal, 1 tumor",
)
