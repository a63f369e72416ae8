"""A digest of each client's data, recorded in ``config.json`` (``run_info.data_digests``)
when a run starts and compared when it resumes: a domain whose images, labels or masks
changed since (one image added, one replaced by another of the same size) is refused in one
line naming it, unless the user says ``--force-data``. The split sizes alone, which the
resume check compared before, miss a replaced image and any change that keeps the counts.

The digest is SHA-256 over the decoded rows the client trains, validates and tests on (the
uint8 pixels, the int64 labels, the masks), read a block of rows at a time, so it covers
exactly what the run uses whatever the dataset's format, and costs one pass over the
pixels (see docs/reliability.md for the measured cost).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from typing import Any

import torch

from fedshift.core.errors import CheckpointError
from fedshift.core.split import Images, Split

#: rows hashed at a time (a block of 28x28 RGB digits is 9 MiB; of 224 px images, 600 MiB)
BLOCK_ROWS = 4096
#: hex digits of each digest kept in config.json
DIGEST_HEX = 32


def _update_images(digest: Any, images: Images) -> None:
    """Feed ``images`` (a tensor or a RowGather) into ``digest``, shape first."""
    digest.update(f"{tuple(images.shape)}:{images.dtype}".encode())
    for start in range(0, len(images), BLOCK_ROWS):
        block = images[start : start + BLOCK_ROWS]
        digest.update(block.contiguous().cpu().numpy().data)


def split_digest(digest: Any, split: Split) -> None:
    """Feed one split's pixels, labels and masks into ``digest``."""
    _update_images(digest, split.x)
    labels = split.y.to(torch.int64).contiguous().cpu()
    digest.update(b"labels")
    digest.update(labels.numpy().data)
    digest.update(b"mask" if split.mask is not None else b"no mask")
    if split.mask is not None:
        _update_images(digest, split.mask)


def client_digest(train: Split, val: Split, test: Split) -> str:
    """The digest of one client's train, val and test splits."""
    digest = hashlib.sha256()
    for name, split in (("train", train), ("val", val), ("test", test)):
        digest.update(name.encode())
        split_digest(digest, split)
    return digest.hexdigest()[:DIGEST_HEX]


def data_digests(clients) -> list[dict[str, Any]]:
    """``{"id", "domain", "digest"}`` of each client of a scenario, in its order."""
    return [
        {"id": c.client_id, "domain": c.domain, "digest": client_digest(c.train, c.val, c.test)}
        for c in clients
    ]


def changed_domains(saved: list[dict] | None, now: list[dict]) -> dict[str, list[int]]:
    """The domains whose clients' digests differ from the saved ones, each with the ids of
    those clients; nothing when the run recorded no digests (a run from before them)."""
    if not saved:
        return {}
    before = {entry.get("id"): entry for entry in saved if isinstance(entry, dict)}
    changed: dict[str, list[int]] = defaultdict(list)
    for entry in now:
        old = before.get(entry["id"])
        if old is None or old.get("digest") != entry["digest"]:
            changed[str(entry["domain"])].append(entry["id"])
    for cid in before.keys() - {entry["id"] for entry in now}:
        changed[str(before[cid].get("domain"))].append(cid)
    return dict(changed)


def check_resume_data(saved: list[dict] | None, now: list[dict]) -> None:
    """Refuse, in one line naming the domains, to resume on data that changed since the run
    started (``--force-data`` skips this check)."""
    changed = changed_domains(saved, now)
    if not changed:
        return
    names = ", ".join(
        f"{domain!r} (clients {', '.join(map(str, sorted(ids)))})"
        for domain, ids in sorted(changed.items())
    )
    raise CheckpointError(
        f"cannot resume: the data of domain {names} changed since the run started (its "
        "images, labels or masks differ from the digest in config.json); start a new run, "
        "or give --force-data to continue this one on the new data"
    )
