"""Record: what travels between server and clients, and the Kind of each array."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import torch

Scalar = int | float | str | bool


class Kind(StrEnum):
    """What an array that leaves a client *is*; privacy filters and reports key off it."""

    MODEL = "model"  # model weights or buffers
    PROTOTYPE = "prototype"  # per-class mean embeddings
    STYLE = "style"  # feature statistics (mean/std)
    AMPLITUDE = "amplitude"  # Fourier amplitude spectra
    FEATURES = "features"  # per-sample embeddings (never raw data)
    LOGITS = "logits"  # per-sample predictions
    SCALAR = "scalar"  # a number, e.g. a generalization gap
    COUNT = "count"  # sample or class counts


@dataclass
class Record:
    """Named tensors plus scalar config and metrics.

    ``arrays`` keys may be dotted (``model.backbone.conv.weight``); ``config`` carries
    instructions to a client and ``metrics`` numbers about the work done (e.g.
    ``num-examples``). Nothing in a Record is pickled when it crosses a boundary.
    """

    arrays: dict[str, torch.Tensor] = field(default_factory=dict)
    config: dict[str, Scalar] = field(default_factory=dict)
    metrics: dict[str, Scalar] = field(default_factory=dict)

    def nbytes(self) -> int:
        """Bytes of the array payload (what a real transport would have to carry)."""
        return sum(t.numel() * t.element_size() for t in self.arrays.values())

    def subset(self, prefix: str) -> dict[str, torch.Tensor]:
        """The arrays under ``prefix.`` with the prefix removed (e.g. a state dict)."""
        cut = len(prefix) + 1
        return {k[cut:]: v for k, v in self.arrays.items() if k.startswith(prefix + ".")}

    def take(self, prefix: str) -> dict[str, torch.Tensor]:
        """:meth:`subset`, and the arrays removed from this record (a reply folded into a
        running sum lets go of them)."""
        taken = self.subset(prefix)
        for key in [k for k in self.arrays if k.startswith(prefix + ".")]:
            del self.arrays[key]
        return taken

    def with_arrays(self, prefix: str, tensors: Mapping[str, torch.Tensor]) -> Record:
        """Add ``tensors`` under ``prefix.``; returns self for chaining."""
        for key, value in tensors.items():
            self.arrays[f"{prefix}.{key}"] = value
        return self


def share_key(array_key: str) -> str:
    """The ``shares`` entry an array key belongs to: the part before the first dot."""
    return array_key.split(".", 1)[0]
