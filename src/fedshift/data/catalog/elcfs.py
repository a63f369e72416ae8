"""The multi-site segmentation sets of FedDG-ELCFS (Liu et al., CVPR 2021), read in the
layout of its official release (github.com/liuquande/FedDG-ELCFS).

* ``fundus`` (optic disc and cup; 4 sites ``client1`` .. ``client4``): the release's README
  layout ``ROOT/client<k>/data_npy/*.npy``. Each file is one ``H×W×5`` array: RGB in
  [0, 255], then the optic-disc mask and the optic-cup mask in {0, 1} (the official loader
  reads ``[..., 0:3]`` and ``[..., 3:]``). Official counts (``train_ELCFS.py``,
  ``slice_num``): 101, 159, 400, 400.
* ``prostate`` (prostate MRI, 6 sites): the layout of the release's prostate loader
  (``dataloaders/__pycache__/prostate_meta.cpython-37.pyc``, shipped compiled only):
  ``ROOT/<site>/*.npy`` (or ``ROOT/<site>/data_npy/*.npy``, the README's folder name) for
  the sites ISBI, ISBI_1.5, I2CVB, UCL, BIDMC, HK; each file one ``H×W×2`` slice: the
  image, then the prostate mask in {0, 1} (``[..., 0:1]`` and ``[..., 1:]``). The release
  states no per-site slice counts, so none are checked.

Masks become one uint8 label map per image (``Split.mask``) whose channels are nested
regions: channel c of a target is ``label > c``. Fundus: 0 background, 1 disc without cup,
2 cup, so channel 0 = disc (the cup lies inside the disc) and channel 1 = cup, as the
official code's two sigmoid outputs; prostate: 0 background, 1 prostate.

Images are resized (bilinear, antialiased) and masks (nearest) to the release's 384 px or
``image_size``. MR slices have no fixed intensity scale: each prostate slice is min-max
scaled to [0, 255]. The release has no train/test split (sources train on all their images,
the unseen site is tested on all of its): per site a seeded 80/20 holdout of the files
(``split_seed``) is train / val, and test is the whole site. Loaded for a protocol whose
scored sites also train (``held_out_test``), a site's test split is instead its file ``i``
in name order when ``i % 10 > 7`` (FPL's rule, 20 %), those files leaving train and val.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedshift.core.bounded import load_npy
from fedshift.data import image_cache
from fedshift.data.catalog.base import (
    HELD_OUT_TEST,
    CatalogDataset,
    Counts,
    LoadOptions,
    check_held_out,
    domain_holdout,
    pooled_domain,
    split_off_test,
)
from fedshift.data.domains import DatasetError, DomainDataset
from fedshift.data.lists import VAL_FRACTION, holdout

if TYPE_CHECKING:  # torch loads only when data is read, not to list or describe it
    import torch


#: the release's image side (``volume_size``: ``[384, 384, 3]`` in ``train_ELCFS.py``,
#: ``[384, 384, 1]`` in ``test_ELCFS.py``)
RESOLUTION = 384
SPLIT = (
    "no official split (sources train on all, the unseen site is tested on all): per site a "
    "seeded 80/20 holdout of the files as train/val (split_seed); test: the whole site"
)
METRIC = "Dice per mask channel (sigmoid > 0.5), averaged over images, then over channels"


def _source(name: str, mask_channels: tuple[str, ...]) -> str:
    return (
        f"{name.capitalize()} multi-site segmentation set of FedDG-ELCFS (Liu et al., CVPR "
        f"2021), official release layout; problem=segmentation, mask channels "
        f"{'/'.join(mask_channels)}, metric: {METRIC}"
    )


@dataclass(frozen=True, kw_only=True)
class ElcfsDataset(CatalogDataset):
    """One ELCFS set: its sites are the domains; what its ``.npy`` arrays hold."""

    image_channels: int
    mask_channels: tuple[str, ...]  # nested: channel c is ``label > c``
    npy_folder: str  # the sub-folder of a site holding the files ("" for the site itself)
    split: str = SPLIT
    resolution: int = RESOLUTION
    own_split: str = "it is split per site"
    whole_domain_test: bool = True

    def count(self, root: Path, domains: tuple[str, ...]) -> tuple[Counts, list[str]]:
        """Per-site per-split counts of ``domains`` after checking every file's ``.npy``
        header, and one warning per site whose count differs from the official one. The
        holdout's sizes depend on the number of files only, not on ``split_seed``."""
        files = site_files(self, root, domains)
        for paths in files.values():
            for path in paths:
                _check_shape(self, path, *_header(path))
        counts = {}
        for site, paths in files.items():
            train, val = holdout([(p, 0) for p in paths], VAL_FRACTION, 0)
            counts[site] = {"train": len(train), "val": len(val), "test": len(paths)}
        return counts, self.total_warnings({d: c["test"] for d, c in counts.items()})

    def read(self, root: Path, options: LoadOptions) -> DomainDataset:
        """Per site a :data:`VAL_FRACTION` holdout seeded per site as train / val (train rows
        first, so both are views of the site's array), test the whole site; with
        ``options.held_out_test`` the site's :func:`split_off_test` files instead, taken out
        of train and val (their rows last). Only ``options.domains`` are read."""
        import torch

        size, seed = self.size(options), options.seed
        meta = self.meta(root, options)
        files = site_files(self, root, options.domains)
        out, counts, cached = {}, {}, {}
        for site, paths in files.items():
            kept, held = domain_holdout([(p, 0) for p in paths], seed, site)
            test = split_off_test(paths)[1] if options.held_out_test else []
            if options.held_out_test:
                check_held_out(self.name, site, len(paths), test)
                held_out = set(test)
                kept, held = ([e for e in part if e[0] not in held_out] for part in (kept, held))
            order = [p for p, _ in kept] + [p for p, _ in held] + test
            pixels, masks, cached[site] = _site_arrays(
                self, site, order, size, options.cache_folder, meta["root"]
            )
            zeros = torch.zeros(len(order), dtype=torch.int64)
            test_from = len(kept) + len(held) if test else None
            out[site] = pooled_domain(
                site, pixels, zeros, len(kept), masks=masks, test_from=test_from
            )
            counts[site] = {"train": len(kept), "val": len(held), "test": len(out[site].test)}
        classes = list(self.mask_channels)
        return DomainDataset(
            name=self.name,
            domains=out,
            classes=classes,
            channels=self.image_channels,
            image_size=size,
            meta={
                **meta,
                "split": f"{SPLIT}, split_seed={seed}"
                + (f"; instead, test: {HELD_OUT_TEST}" if options.held_out_test else ""),
                "augment": self.augment,
                "classes": classes,
                "counts": counts,
                "problem": "segmentation",
                "mask_channels": classes,
                "image_cache": cached,
            },
        )


FUNDUS = ElcfsDataset(
    name="fundus",
    source=_source("fundus", ("disc", "cup")),
    domains=("client1", "client2", "client3", "client4"),
    layout="ROOT/client{1..4}/data_npy/*.npy, each H×W×5: RGB 0..255, disc mask, cup mask (0/1)",
    image_channels=3,
    mask_channels=("disc", "cup"),
    classes=("disc", "cup"),
    official_totals={"client1": 101, "client2": 159, "client3": 400, "client4": 400},
    npy_folder="data_npy",
    description="retinal fundus photos from 4 sites, optic disc and cup segmentation",
    class_source="the mask channels of each .npy file, one per segmented structure",
)
PROSTATE = ElcfsDataset(
    name="prostate",
    source=_source("prostate", ("prostate",)),
    domains=("BIDMC", "HK", "I2CVB", "ISBI", "ISBI_1.5", "UCL"),
    layout=(
        "ROOT/<site>/*.npy (or ROOT/<site>/data_npy/*.npy) for sites BIDMC, HK, I2CVB, ISBI, "
        "ISBI_1.5, UCL; each H×W×2: image, prostate mask (0/1)"
    ),
    image_channels=1,
    mask_channels=("prostate",),
    classes=("prostate",),
    npy_folder="",
    description="prostate MRI slices from 6 sites, prostate segmentation",
    class_source="the mask channel of each .npy file",
)
#: the segmentation sets by name
SETS = {s.name: s for s in (FUNDUS, PROSTATE)}


def site_files(
    spec: ElcfsDataset, root: Path, sites: Sequence[str] | None = None
) -> dict[str, list[Path]]:
    """Site -> its ``.npy`` files, sorted by name (hidden files such as macOS's ``._*`` left
    out), for ``sites`` (None: every site); a missing site or an empty one raises."""
    if not root.is_dir():
        raise DatasetError(f"dataset root {root} does not exist (expected {spec.layout})")
    out = {}
    for site in spec.domains if sites is None else sites:
        folder = root / site
        nested = folder / "data_npy"
        if nested.is_dir() or spec.npy_folder:
            folder = nested
        if not folder.is_dir():
            raise DatasetError(f"missing site folder {folder} (expected {spec.layout})")
        files = sorted(
            p
            for p in folder.iterdir()
            if p.suffix == ".npy" and not p.name.startswith(".") and p.is_file()
        )
        if not files:
            raise DatasetError(f"site folder {folder} has no .npy file (expected {spec.layout})")
        out[site] = files
    return out


def _header(path: Path) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of a ``.npy`` file, from its header (the data is only mapped)."""
    array = load_npy(path, DatasetError, mmap_mode="r")
    return tuple(array.shape), array.dtype


def _check_shape(spec: ElcfsDataset, path: Path, shape: tuple[int, ...], dtype: np.dtype) -> None:
    depth = spec.image_channels + len(spec.mask_channels)
    if len(shape) != 3 or shape[2] != depth or dtype.kind not in "biuf":
        raise DatasetError(
            f"{path} holds a {dtype} array of shape {shape}; expected a numeric H×W×{depth} "
            f"array ({spec.layout})"
        )


def _read(spec: ElcfsDataset, path: Path) -> np.ndarray:
    array = load_npy(path, DatasetError)
    _check_shape(spec, path, array.shape, array.dtype)
    return array


def label_map(spec: ElcfsDataset, path: Path, masks: np.ndarray) -> np.ndarray:
    """The nested label map (uint8 H×W) of binary masks ``H×W×C``: the number of channels
    a pixel belongs to, counting from the first; a mask value outside {0, 1} raises."""
    values = np.unique(masks)
    if not np.isin(values, (0, 1)).all():
        raise DatasetError(
            f"{path}: mask values {values[:8].tolist()}, expected 0 and 1 in each of the "
            f"{'/'.join(spec.mask_channels)} channels"
        )
    inside = masks.astype(bool)
    label = inside[..., 0].astype(np.uint8)
    for c in range(1, inside.shape[-1]):
        outside = inside[..., c] & ~inside[..., c - 1]
        if outside.any():
            warnings.warn(
                f"fedshift: {path}: {int(outside.sum())} {spec.mask_channels[c]} pixels lie "
                f"outside the {spec.mask_channels[c - 1]} mask; counted as inside it",
                RuntimeWarning,
                stacklevel=2,
            )
        label[inside[..., c]] = c + 1
    return label


def _image(spec: ElcfsDataset, path: Path, image: np.ndarray, size: int) -> torch.Tensor:
    """uint8 ``C×size×size``: fundus as stored (checked to lie in [0, 255]), prostate min-max
    scaled to [0, 255] after resizing."""
    import torch
    import torch.nn.functional as F

    pixels = torch.from_numpy(np.ascontiguousarray(image, dtype=np.float32)).permute(2, 0, 1)
    low, high = float(pixels.min()), float(pixels.max())
    if spec.image_channels == 3 and (low < 0.0 or high > 255.0):
        raise DatasetError(f"{path}: image values span [{low:g}, {high:g}], expected 0..255")
    if tuple(pixels.shape[-2:]) != (size, size):
        pixels = F.interpolate(
            pixels[None], size=(size, size), mode="bilinear", align_corners=False, antialias=True
        )[0]
    if spec.image_channels == 1:
        low, high = pixels.min(), pixels.max()
        pixels = (pixels - low) * (255.0 / (high - low)) if high > low else pixels * 0.0
    return pixels.round().clamp(0, 255).to(torch.uint8)


def decode(spec: ElcfsDataset, path: Path, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 image ``C×size×size``, uint8 label map ``size×size``) of one file."""
    import torch
    import torch.nn.functional as F

    array = _read(spec, path)
    image = _image(spec, path, array[..., : spec.image_channels], size)
    label = torch.from_numpy(label_map(spec, path, array[..., spec.image_channels :]))
    if tuple(label.shape) != (size, size):
        label = F.interpolate(label[None, None].float(), size=(size, size), mode="nearest")[0, 0]
    return image.numpy(), label.to(torch.uint8).numpy()


def _decode_all(
    spec: ElcfsDataset,
    files: Sequence[Path],
    size: int,
    store_mask: Callable[[int, np.ndarray], None],
) -> Iterator[np.ndarray]:
    """The images of ``files`` in order (decoded by a few threads); each label map goes to
    ``store_mask(row, label)``."""
    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        decoded = pool.map(lambda path: decode(spec, path, size), files)
        for i, (image, label) in enumerate(decoded):
            store_mask(i, label)
            yield image


def _site_arrays(
    spec: ElcfsDataset, site: str, files: Sequence[Path], size: int, folder: Path | None, root: str
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """(images N×C×S×S, label maps N×S×S, cache file or ""): mapped from the image cache,
    decoded into it on the first load; in memory without a cache folder or when it cannot
    be written."""
    import torch

    n, channels = len(files), spec.image_channels
    image_shape, mask_shape = (n, channels, size, size), (n, size, size)
    masks = np.empty(mask_shape, dtype=np.uint8)

    def keep(i: int, label: np.ndarray) -> None:
        masks[i] = label

    if folder is not None:
        key = image_cache.cache_key(spec.name, root, site, size, files)
        data, sidecar = image_cache.cache_paths(folder, spec.name, site, size, key)
        mask_data, mask_sidecar = image_cache.cache_paths(
            folder, spec.name, f"{site}-mask", size, key
        )
        # copy-on-write maps, as after a first load below: the splits are plain tensor
        # views (pooled_domain), so torch must get writable arrays (a read-only map makes
        # it warn "The given NumPy array is not writable"); a write stays private to this
        # process and nothing is copied up front (these sets are a few hundred images)
        pixels = image_cache.open_cached(data, sidecar, image_shape, mmap_mode="c")
        cached_masks = image_cache.open_cached(mask_data, mask_sidecar, mask_shape, "c")
        if pixels is not None and cached_masks is not None:
            return torch.from_numpy(pixels), torch.from_numpy(cached_masks), str(data)
        description = {"dataset": spec.name, "domain": site, "root": root, "key": key}
        try:
            folder.mkdir(parents=True, exist_ok=True)
            images = _decode_all(spec, files, size, keep)
            image_cache.write_cache(data, sidecar, image_shape, images, description)
            mask_description = {**description, "domain": f"{site} masks"}
            image_cache.write_cache(
                mask_data, mask_sidecar, mask_shape, iter(masks), mask_description
            )
            pixels = np.load(data, mmap_mode="c", allow_pickle=False)
            mapped = np.load(mask_data, mmap_mode="c", allow_pickle=False)
            return torch.from_numpy(pixels), torch.from_numpy(mapped), str(data)
        except OSError as exc:
            warnings.warn(
                f"fedshift: could not write the image cache {data} ({exc}); decoding "
                f"{spec.name}/{site} into memory",
                RuntimeWarning,
                stacklevel=3,
            )
    pixels = np.empty(image_shape, dtype=np.uint8)
    for i, image in enumerate(_decode_all(spec, files, size, keep)):
        pixels[i] = image
    return torch.from_numpy(pixels), torch.from_numpy(masks), ""
