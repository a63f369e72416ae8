"""A digest of each domain's data, recorded in ``config.json`` (``run_info.data_digests``)
when a run starts and compared when it resumes: a domain whose images, labels or masks
changed since (one image added, one replaced by another of the same size) is refused in one
line naming it, unless the user says ``--force-data``. The split sizes alone, which the
resume check compared before, miss a replaced image and any change that keeps the counts.

The digest is SHA-256 over each domain's decoded rows (the uint8 pixels, the int64 labels,
the masks of its train, val and test splits), read a block of rows at a time, so it covers
exactly what the run trains and scores on whatever the dataset's format, and costs one pass
over the pixels (see docs/reliability.md for the measured cost).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from fedshift.core.errors import CheckpointError
from fedshift.core.split import Images, Split
from fedshift.data.domains import DomainDataset

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


def domain_digest(train: Split, val: Split, test: Split) -> str:
    """The digest of one domain's train, val and test splits."""
    digest = hashlib.sha256()
    for name, split in (("train", train), ("val", val), ("test", test)):
        digest.update(name.encode())
        split_digest(digest, split)
    return digest.hexdigest()[:DIGEST_HEX]


def data_digests(dataset: DomainDataset) -> dict[str, str]:
    """Each domain's digest, by name: the clients' shares, the validation and test splits
    a run scores on and the server's data are all drawn from these."""
    return {
        name: domain_digest(domain.train, domain.val, domain.test)
        for name, domain in dataset.domains.items()
    }


def changed_domains(saved: Any, now: dict[str, str]) -> list[str]:
    """The domains whose digest differs from the saved one, or that were added or removed;
    nothing when the run recorded no digests (a run from before them)."""
    if not isinstance(saved, dict) or not saved:
        return []
    return sorted(name for name in saved.keys() | now.keys() if saved.get(name) != now.get(name))


def check_resume_data(saved: Any, now: dict[str, str]) -> None:
    """Refuse, in one line naming the domains, to resume on data that changed since the run
    started (``--force-data`` skips this check)."""
    changed = changed_domains(saved, now)
    if not changed:
        return
    names = ", ".join(repr(name) for name in changed)
    which = "domain" if len(changed) == 1 else "domains"
    raise CheckpointError(
        f"cannot resume: the data of {which} {names} changed since the run started (images, "
        "labels or masks differ from the digest in config.json); start a new run, or give "
        "--force-data to continue this one on the new data"
    )
