"""The run's dataset, built once per SuperNode into memory-mapped ``.npy`` files.

Flower 1.41 starts a new ClientApp process for every message, so without a cache every
message reads and checks the whole dataset archive again and cuts the run's samples from
it. :func:`node_dataset` does that work once per (dataset, image size, ``max-samples``)
and writes every tensor of the result as a plain ``.npy`` (uint8 images, int64 labels, no
pickle) under ``<cache>/flower-node/<key>/``, with a ``manifest.json`` holding each file's
sha256. Later messages map the image and mask files read-only (``mmap_mode="r"``, as
RowGather views: pages are read when a batch touches them, reads copy, nothing is copied up
front; a copy-on-write mapping would be charged against memory and refused for a file larger
than RAM + swap).

Checksums are verified when a file is first opened after it changed: a ``verified.json``
stamp records each file's size and modification time at its last full check, so an
unchanged cache costs no hashing, and a truncated, edited or missing file fails the check
and the cache is rebuilt (logged). Building goes to a temporary folder renamed into place,
so concurrent builders never leave a half-written cache.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedshift.core.runconfig import RunConfig
from fedshift.core.split import Images, RowGather, Split
from fedshift.data.domains import Domain, DomainDataset

log = logging.getLogger(__name__)

#: bump when the layout changes, so old caches are rebuilt, never misread
LAYOUT = 1
MANIFEST, STAMP = "manifest.json", "verified.json"
SPLITS = ("train", "val", "test")
FIELDS = ("x", "y", "mask")


class CacheInvalid(ValueError):
    """A node cache that is missing, incomplete or fails its checksums."""


def cache_key(cfg: RunConfig, max_samples: int) -> str:
    """What the cached dataset depends on, as a short hash."""
    spec = {"layout": LAYOUT, "dataset": cfg.dataset, "image_size": cfg.image_size or 0}
    spec["max_samples"] = int(max_samples)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _file_id(path: Path) -> list[int]:
    info = path.stat()
    return [info.st_size, info.st_mtime_ns]


def _save(path: Path, images: Images, rows_at_once: int = 1024) -> None:
    """``np.save`` of a tensor, or of a RowGather gathered a block of rows at a time (a
    memory-mapped dataset is never copied into memory whole)."""
    if not isinstance(images, RowGather):
        np.save(path, images.numpy(), allow_pickle=False)
        return
    dtype = images[:0].numpy().dtype
    out = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=tuple(images.shape))
    for start in range(0, len(images), rows_at_once):
        out[start : start + rows_at_once] = images[start : start + rows_at_once].numpy()
    out.flush()
    del out


def write_cache(dataset: DomainDataset, folder: Path) -> None:
    """Write ``dataset`` into ``folder`` (built in a temporary sibling, then renamed)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        files: dict[str, str] = {}
        domains: list[str] = []
        for name, domain in dataset.domains.items():
            domains.append(name)
            for split_name in SPLITS:
                split = domain.split(split_name)
                for field in FIELDS:
                    tensor = getattr(split, field)
                    if tensor is None:
                        continue
                    file = f"{len(domains) - 1}-{split_name}-{field}.npy"
                    _save(build / file, tensor)
                    files[file] = _sha256(build / file)
        manifest = {
            "layout": LAYOUT,
            "name": dataset.name,
            "domains": domains,
            "classes": list(dataset.classes),
            "channels": dataset.channels,
            "image_size": dataset.image_size,
            "meta": dataset.meta,
            "files": files,
        }
        (build / MANIFEST).write_text(json.dumps(manifest, indent=1))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(build, folder)
    finally:
        shutil.rmtree(build, ignore_errors=True)


def _verify(folder: Path) -> dict[str, Any]:
    """The manifest, after checking every file changed since its last full check."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files: dict[str, str] = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CacheInvalid(f"unreadable manifest ({exc})") from None
    if manifest.get("layout") != LAYOUT:
        raise CacheInvalid(f"layout {manifest.get('layout')!r}, expected {LAYOUT}")
    try:
        stamp = json.loads((folder / STAMP).read_text())
    except (OSError, ValueError):
        stamp = {}
    checked: dict[str, list[int]] = {}
    for file, digest in files.items():
        path = folder / file
        try:
            now = _file_id(path)
        except OSError:
            raise CacheInvalid(f"{file} is missing") from None
        if stamp.get(file) != now:
            if _sha256(path) != digest:
                raise CacheInvalid(f"{file} fails its sha256")
        checked[file] = now
    if checked != stamp:
        tmp = folder / f".{STAMP}.{os.getpid()}"
        tmp.write_text(json.dumps(checked))
        os.replace(tmp, folder / STAMP)
    return manifest


def open_cache(folder: Path) -> DomainDataset:
    """The cached dataset: images and masks memory-mapped read-only, as RowGather views
    (reads copy, so the files are never written), labels read into memory."""
    manifest = _verify(folder)

    def tensor(domain: int, split: str, field: str) -> Images | None:
        file = f"{domain}-{split}-{field}.npy"
        if file not in manifest["files"]:
            return None
        if field == "y":
            return torch.from_numpy(np.load(folder / file, allow_pickle=False))
        mapped = np.load(folder / file, mmap_mode="r", allow_pickle=False)
        with warnings.catch_warnings():  # read-only: only the RowGather reads it
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            stored = torch.from_numpy(mapped)
        return RowGather.take(stored, torch.arange(len(stored)))

    domains = {}
    for index, name in enumerate(manifest["domains"]):
        splits = {
            split: Split(
                x=tensor(index, split, "x"),
                y=tensor(index, split, "y"),
                mask=tensor(index, split, "mask"),
            )
            for split in SPLITS
        }
        domains[name] = Domain(name=name, **splits)
    return DomainDataset(
        name=manifest["name"],
        domains=domains,
        classes=list(manifest["classes"]),
        channels=int(manifest["channels"]),
        image_size=int(manifest["image_size"]),
        meta=dict(manifest["meta"]),
    )


def node_dataset(cfg: RunConfig, max_samples: int, cache_root: Path, build) -> DomainDataset:
    """The run's dataset from the node cache under ``cache_root``, built by ``build()``
    (and written) when the cache is missing or fails its checks."""
    folder = Path(cache_root) / "flower-node" / cache_key(cfg, max_samples)
    if (folder / MANIFEST).is_file():
        try:
            return open_cache(folder)
        except CacheInvalid as exc:
            log.warning("node dataset cache %s is invalid (%s); rebuilding it", folder, exc)
    dataset = build()
    try:
        write_cache(dataset, folder)
    except OSError as exc:
        log.warning("cannot write the node dataset cache %s (%s); using memory", folder, exc)
        return dataset
    return open_cache(folder)
