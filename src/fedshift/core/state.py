"""Server state and atomic, pickle-free checkpoints."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedshift.core.errors import CheckpointError


@dataclass
class ServerState:
    """Everything the server program carries from round to round.

    ``model`` is the global model's state dict (may be empty for methods without a global
    model); ``extra`` holds any other tensors or scalars (prototype tables, aggregation
    weights, the best round by IDD, ...). Both must contain only tensors, numbers, strings,
    bools, None and nested dicts/lists of those so they load with ``weights_only=True``.
    """

    model: dict[str, torch.Tensor] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "extra": self.extra}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServerState:
        return cls(model=dict(data["model"]), extra=dict(data["extra"]))


#: format tag of every file :func:`load_checkpoint` accepts
CHECKPOINT_FORMAT = "fedshift-checkpoint-v1"


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` to a temp file in the same folder, fsync, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Load a checkpoint written by :func:`atomic_save` without unpickling arbitrary objects."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(
            f"no checkpoint at {path}; start without --resume or give the run dir"
        )
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for truncated/garbage files
        raise CheckpointError(
            f"checkpoint {path} is corrupt or not a fedshift checkpoint ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0][:120]}); delete it to start over"
        ) from exc
    if not isinstance(data, dict) or data.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not a fedshift checkpoint (missing format tag)")
    return data
