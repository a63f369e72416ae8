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
and the cache is rebuilt (logged). Building goes to a temporary folder renamed into place
only where no cache is (the SuperNodes of one machine share it): concurrent builders never
leave a half-written cache, and a late builder uses the cache published first instead of
deleting it under a process that reads it (before, it did: under load the first node's
task failed with "1-test-x.npy is missing").
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fedshift.core.bounded import MAX_SIDECAR_BYTES, load_npy, open_regular, read_json_bounded
from fedshift.core.runconfig import RunConfig
from fedshift.core.split import Images, RowGather, Split
from fedshift.data.domains import Domain, DomainDataset

log = logging.getLogger(__name__)

#: bump when the layout changes, so old caches are rebuilt, never misread
LAYOUT = 1
MANIFEST, STAMP = "manifest.json", "verified.json"
SPLITS = ("train", "val", "test")
FIELDS = ("x", "y", "mask")


#: the name of a cached tensor's file (``<domain>-<split>-<field>.npy``)
CACHE_FILE = re.compile(r"[0-9]{1,6}-(train|val|test)-(x|y|mask)\.npy")


class CacheInvalid(ValueError):
    """A node cache that is missing, incomplete, malformed or fails its checksums."""


def cache_key(cfg: RunConfig, max_samples: int) -> str:
    """What the cached dataset depends on, as a short hash."""
    spec = {"layout": LAYOUT, "dataset": cfg.dataset, "image_size": cfg.image_size or 0}
    spec["max_samples"] = int(max_samples)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def _sha256(path: Path) -> str:
    with open_regular(path, CacheInvalid, "node cache file") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


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


def write_cache(dataset: DomainDataset, folder: Path) -> bool:
    """Write ``dataset`` into ``folder``: built in a temporary sibling, then renamed into
    place only if ``folder`` does not exist. False when it does (another SuperNode on this
    machine published the same cache meanwhile): nothing is replaced, so a cache another
    process is reading never disappears under it."""
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
        try:
            os.rename(build, folder)  # atomic; refused when folder exists and holds files
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            return False
        return True
    finally:
        shutil.rmtree(build, ignore_errors=True)


def retire(folder: Path) -> None:
    """Move an invalid cache aside (one atomic rename) and delete it; a process still
    reading its files keeps them until it closes them."""
    stale = folder.with_name(f".{folder.name}-stale-{os.getpid()}")
    try:
        os.rename(folder, stale)
    except FileNotFoundError:
        return  # another process retired it first
    shutil.rmtree(stale, ignore_errors=True)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _check_manifest(manifest: Any) -> dict[str, Any]:
    """``manifest`` if it has the shape :func:`write_cache` writes, else CacheInvalid."""
    if not isinstance(manifest, dict):
        raise CacheInvalid(f"the manifest is a {type(manifest).__name__}, not an object")
    if manifest.get("layout") != LAYOUT:
        raise CacheInvalid(f"layout {str(manifest.get('layout'))[:40]!r}, expected {LAYOUT}")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(
        isinstance(f, str) and CACHE_FILE.fullmatch(f) and isinstance(d, str)
        for f, d in files.items()
    ):
        raise CacheInvalid("the manifest's files are not {'<d>-<split>-<field>.npy': sha256}")
    fields = {"name": str, "channels": int, "image_size": int, "meta": dict}
    for key, kind in fields.items():
        if not isinstance(manifest.get(key), kind) or isinstance(manifest.get(key), bool):
            raise CacheInvalid(f"the manifest's {key!r} is not a {kind.__name__}")
    if not _strings(manifest.get("domains")) or not _strings(manifest.get("classes")):
        raise CacheInvalid("the manifest's domains or classes are not lists of names")
    return manifest


def _verify(folder: Path) -> dict[str, Any]:
    """The manifest, after checking every file changed since its last full check."""
    manifest = _check_manifest(
        read_json_bounded(folder / MANIFEST, CacheInvalid, MAX_SIDECAR_BYTES)
    )
    files: dict[str, str] = manifest["files"]
    try:
        stamp = read_json_bounded(folder / STAMP, CacheInvalid, MAX_SIDECAR_BYTES)
    except CacheInvalid:
        stamp = {}
    if not isinstance(stamp, dict):
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
            return torch.from_numpy(load_npy(folder / file, CacheInvalid))
        mapped = load_npy(folder / file, CacheInvalid, mmap_mode="r")
        with warnings.catch_warnings():  # read-only: only the RowGather reads it
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            stored = torch.from_numpy(mapped)
        return RowGather.take(stored, torch.arange(len(stored)))

    try:  # arrays that do not fit together (a manifest written by someone else)
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
    except CacheInvalid:
        raise
    except (ValueError, TypeError, IndexError, AttributeError, RuntimeError) as exc:
        reason = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise CacheInvalid(f"the cached arrays do not fit together ({reason})") from None


def node_dataset(cfg: RunConfig, max_samples: int, cache_root: Path, build) -> DomainDataset:
    """The run's dataset from the node cache under ``cache_root``, built by ``build()``
    (and written) when the cache is missing or fails its checks."""
    folder = Path(cache_root) / "flower-node" / cache_key(cfg, max_samples)
    if folder.exists():
        try:
            return open_cache(folder)
        except CacheInvalid as exc:
            log.warning("node dataset cache %s is invalid (%s); rebuilding it", folder, exc)
            retire(folder)
    dataset = build()
    for _ in range(2):
        try:
            write_cache(dataset, folder)  # False: another node published it meanwhile
            return open_cache(folder)
        except CacheInvalid as exc:
            log.warning("node dataset cache %s is invalid (%s); rebuilding it", folder, exc)
            retire(folder)
        except OSError as exc:
            log.warning("cannot write the node dataset cache %s (%s); using memory", folder, exc)
            return dataset
    return dataset
