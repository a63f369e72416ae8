"""What a client task sees: its data views, RNG, device and persistent state."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from fedshift.core.runconfig import section_dataclass
from fedshift.core.split import Images, Split, to_input


class LabelAccessError(PermissionError):
    """A task tried to read labels of an unlabeled (target) client."""


class SplitView:
    """A client's view of one split. Labels are unreachable when ``labeled`` is False.

    ``x`` is the split's images, a tensor or a lazy :class:`~fedshift.core.split.RowGather`:
    index it (``view.x[idx]``) for the rows a step needs, or gather it whole with
    :func:`~fedshift.core.split.dense` when a method needs the client's whole share at once.

    ``augment`` (uint8 images, generator -> uint8 images) is applied to the batches drawn
    with a generator, i.e. training batches; evaluation passes (no generator) see the images
    as stored.
    """

    def __init__(
        self,
        split: Split,
        labeled: bool,
        device: torch.device,
        augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None = None,
    ):
        self._split = split
        self.labeled = labeled
        self.device = device
        self.augment = augment

    def __len__(self) -> int:
        return len(self._split)

    @property
    def x(self) -> Images:
        return self._split.x

    @property
    def y(self) -> torch.Tensor:
        if not self.labeled:
            raise LabelAccessError("this client is a target client: its labels are not available")
        return self._split.y

    @property
    def mask(self) -> Images | None:
        if not self.labeled:
            raise LabelAccessError("this client is a target client: its masks are not available")
        return self._split.mask

    def batches(
        self,
        batch_size: int,
        rng: torch.Generator | None = None,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        labels: bool = True,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor | None]]:
        """Yield ``(x, y)`` batches on the device, x normalized to [-1, 1] (augmented first
        when the view has an ``augment`` and ``rng`` is given).

        ``y`` is None when ``labels`` is False; asking for labels of an unlabeled client
        raises :class:`LabelAccessError`.
        """
        n = len(self._split)
        y_all = self.y if labels else None
        order = torch.randperm(n, generator=rng) if shuffle else torch.arange(n)
        stop = n - (n % batch_size) if drop_last and n >= batch_size else n
        for start in range(0, stop, batch_size):
            idx = order[start : start + batch_size]
            images = self._split.x[idx]
            if self.augment is not None and rng is not None:
                images = self.augment(images.to(self.device, non_blocking=True), rng)
            x = to_input(images, self.device)
            y = y_all[idx].to(self.device, non_blocking=True) if y_all is not None else None
            yield x, y


#: the autocast dtype of each reduced precision
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class MixedPrecision:
    """A run's training precision: ``fp32`` (no autocast), or ``bf16`` / ``fp16`` autocast of
    forward passes on ``device_type``. Weights, gradients, optimizer state and checkpoints
    stay fp32; only the ops autocast picks run in the reduced dtype."""

    name: str = "fp32"
    device_type: str = "cpu"

    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast to this precision's dtype (a no-op for fp32): wrap forward passes and
        loss computations in it, not the backward pass or optimizer step."""
        if self.name == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=AUTOCAST_DTYPES[self.name])

    def scaler(self) -> torch.amp.GradScaler | None:
        """A fresh loss scaler for fp16 (its small range underflows gradients), else None.
        One lives for one local training call, so no scaler state crosses rounds and a
        resumed run repeats the same steps."""
        return torch.amp.GradScaler(self.device_type) if self.name == "fp16" else None


#: Run-level local-training settings shared by all algorithms: the run keys of section
#: ``training`` (lr, momentum, weight_decay, batch_size, local_epochs, optimizer) with their
#: declared defaults; ``TrainConfig.of(cfg)`` takes a run's
TrainConfig = section_dataclass(
    "TrainConfig",
    "training",
    "Run-level local-training settings shared by all algorithms (the run keys of section "
    "training).",
    __name__,
)


@dataclass
class ClientContext:
    """Everything a client task may use. ``state`` persists across rounds (checkpointed)."""

    client_id: int
    name: str
    domain: str
    role: str
    train: SplitView
    val: SplitView | None
    test: SplitView | None
    num_classes: int
    build_model: Callable[[], torch.nn.Module]
    rng: torch.Generator
    device: torch.device
    train_cfg: TrainConfig
    round: int = 0
    total_rounds: int = 1
    state: dict[str, Any] = field(default_factory=dict)
    precision: MixedPrecision = field(default_factory=MixedPrecision)

    @property
    def labeled(self) -> bool:
        return self.role == "source"

    def autocast(self) -> contextlib.AbstractContextManager:
        """The run's precision around a forward pass (see :class:`MixedPrecision`)."""
        return self.precision.autocast()
