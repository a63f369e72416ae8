"""Algorithm hyperparameters: one declaration form, validated in one place.

Every algorithm declares a frozen dataclass deriving from :class:`BaseHparams` whose
defaults are the paper's or the official code's values. Choice fields are typed
``Literal[...]`` (a value outside the choices is an error naming them); range checks live
in the dataclass's :meth:`BaseHparams.check`. :func:`make_hparams` is the only way a run
builds one, so every bad value is a :class:`ConfigError` and never a traceback.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from typing import Any, Literal

from fedshift.core.errors import ConfigError, did_you_mean
from fedshift.core.runconfig import coerce, field_type


@dataclasses.dataclass(frozen=True)
class BaseHparams:
    """Base of every algorithm's hyperparameters: on construction, every ``Literal`` field
    must hold one of its choices and :meth:`check` must pass (subclasses define no
    ``__post_init__`` of their own)."""

    def __post_init__(self) -> None:
        for name, kind in hparam_types(type(self)).items():
            value = getattr(self, name)
            if typing.get_origin(kind) is Literal:
                coerce(value, kind, f"algo.{name}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"algo.{name} must be a finite number, got {value}")
        self.check()

    def check(self) -> None:
        """Raise :class:`ConfigError` for values out of range (override; default: none)."""


@dataclasses.dataclass(frozen=True)
class NoHparams(BaseHparams):
    """An algorithm without hyperparameters of its own."""


def hparam_types(cls: type) -> dict[str, Any]:
    """Field name -> declared type (``bool``, ``int``, ``float``, ``str`` or a Literal)."""
    return {f.name: field_type(cls, f.name) for f in dataclasses.fields(cls)}


def coerce_hparam(cls: type, name: str, value: Any, algorithm: str) -> Any:
    """``value`` converted to field ``name``'s type; an unknown name is a ConfigError."""
    types_ = hparam_types(cls)
    if name not in types_:
        valid = ", ".join(f"algo.{n}" for n in types_) or "(none)"
        hint = did_you_mean(name, types_).replace("'", "'algo.", 1)
        raise ConfigError(
            f"unknown hyperparameter 'algo.{name}' for algorithm {algorithm!r}{hint}; "
            f"valid: {valid}"
        )
    return coerce(value, types_[name], f"algo.{name}")


def check_ranges(
    hparams: BaseHparams,
    *,
    positive: tuple[str, ...] = (),
    non_negative: tuple[str, ...] = (),
    unit: tuple[str, ...] = (),
    at_least_one: tuple[str, ...] = (),
) -> None:
    """Range checks of :meth:`BaseHparams.check` by field name: ``> 0``, ``>= 0``, in
    ``[0, 1]`` (probabilities, mixing weights) and ``>= 1`` (counts, sizes)."""
    rules = (
        (positive, lambda v: v > 0, "> 0"),
        (non_negative, lambda v: v >= 0, ">= 0"),
        (unit, lambda v: 0 <= v <= 1, "in [0, 1]"),
        (at_least_one, lambda v: v >= 1, ">= 1"),
    )
    for names, holds, text in rules:
        for name in names:
            value = getattr(hparams, name)
            if not holds(value):
                raise ConfigError(f"algo.{name} must be {text}, got {value}")


def make_hparams(cls: type, values: Mapping[str, Any], algorithm: str = "") -> BaseHparams:
    """Build and check ``cls`` from ``values`` (already coerced or raw text)."""
    coerced = {k: coerce_hparam(cls, k, v, algorithm) for k, v in values.items()}
    try:
        return cls(**coerced)
    except ValueError as exc:  # ConfigError is a ValueError; plain ones are rewrapped
        raise ConfigError(str(exc)) from None
