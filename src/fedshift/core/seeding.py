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


def seed_torch(seed: int, device: torch.device) -> None:
    """Seed torch's global RNG for work on ``device``.

    On the CPU this seeds the CPU generator directly: the same numbers as
    ``torch.manual_seed``, without its lazy CUDA seeding, which formats the Python stack on
    every call (a measurable share of a client call with hundreds of clients).
    """
    if device.type == "cpu":
        torch.default_generator.manual_seed(seed)
    else:
        torch.manual_seed(seed)
