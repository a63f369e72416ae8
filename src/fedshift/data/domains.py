"""Data containers: a :class:`Domain` (three :class:`~fedshift.core.split.Split` s) and a
:class:`DomainDataset`.

Images are kept in memory as ``uint8`` tensors of shape ``(N, C, H, W)``; labels are ``int64``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fedshift.core.errors import DatasetError

if TYPE_CHECKING:
    from fedshift.core.split import Split

__all__ = ["DatasetError", "Domain", "DomainDataset", "Split"]


def __getattr__(name: str) -> Any:
    """``Split`` from :mod:`fedshift.core.split`, imported on first use (it imports torch; the
    containers' names alone, as the partitioners and the catalog read them, need none)."""
    if name == "Split":
        from fedshift.core.split import Split

        return Split
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True, eq=False)
class Domain:
    """A named labeled image set with train / validation / test splits."""

    name: str
    train: Split
    val: Split
    test: Split

    def split(self, name: str) -> Split:
        if name not in ("train", "val", "test"):
            raise DatasetError(f"unknown split {name!r}; expected one of: train, val, test")
        return getattr(self, name)


@dataclass(frozen=True, eq=False)
class DomainDataset:
    """A multi-domain dataset: ``domains`` maps domain name -> :class:`Domain` (ordered)."""

    name: str
    domains: dict[str, Domain]
    classes: list[str]
    channels: int
    image_size: int
    meta: dict = field(default_factory=dict)

    def domain(self, name: str) -> Domain:
        try:
            return self.domains[name]
        except KeyError:
            valid = ", ".join(self.domains) or "(none)"
            raise DatasetError(
                f"unknown domain {name!r} for dataset {self.name!r}; valid domains: {valid}"
            ) from None

    @property
    def domain_names(self) -> list[str]:
        return list(self.domains)

    @property
    def num_classes(self) -> int:
        return len(self.classes)
