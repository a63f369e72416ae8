"""Counter-based seeding: every random stream is a pure function of (run seed, purpose, ...).

Deriving each stream from its coordinates instead of threading one generator through the
run makes results independent of execution order (in-process, parallel or on Flower) and
makes resuming exact: a checkpoint only needs the round counter.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any sequence of printable parts."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def torch_generator(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(*parts))


def numpy_generator(*parts: object) -> np.random.Generator:
    return np.random.default_rng(derive_seed(*parts))
