"""Algorithm hyperparameters: one declaration per knob, validated in one place.

Every algorithm declares a frozen dataclass deriving from :class:`BaseHparams` whose
defaults are the paper's or the official code's values. Each field is an :func:`hp`
declaration holding its meaning, the paper's symbol and its allowed range; choice fields are
typed ``Literal[...]``. :meth:`BaseHparams.__post_init__` checks every choice and range with
one message style, and a subclass's :meth:`BaseHparams.check` keeps only the rules that tie
fields together. :func:`describe_hparams` is the one reader of the declarations (``fedshift
show``, ``--help``, the generated method pages). :func:`make_hparams` is the only way a run
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

#: the field-metadata key holding an :func:`hp` declaration's :class:`HparamRange`
RANGE_KEY = "range"


@dataclasses.dataclass(frozen=True)
class HparamRange:
    """The interval a numeric hyperparameter must lie in; a missing bound is unbounded."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: float) -> bool:
        """Whether ``value`` lies in the interval."""
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def text(self) -> str:
        """The interval as a message says it: ``>= 0``, ``> 0``, ``in [0, 1]``, ``in (0, 1)``."""
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"in {left}{self.low}, {self.high}{right}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low}"
        if self.high is not None:
            return f"{'<' if self.high_open else '<='} {self.high}"
        return ""


def hp(
    default: Any,
    symbol: str = "",
    help: str = "",
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> Any:
    """One hyperparameter: its default, the paper's ``symbol`` (empty where the paper has
    none), its meaning (``help``) and its range (``low``/``high``, each closed unless
    ``low_open``/``high_open``), checked on construction of the dataclass."""
    if (low_open and low is None) or (high_open and high is None):
        raise TypeError("an open bound needs its value (low_open needs low, high_open high)")
    interval = HparamRange(low, high, low_open, high_open)
    if interval.text() and not interval.holds(default):
        raise TypeError(f"default {default!r} lies outside its own range {interval.text()}")
    return dataclasses.field(
        default=default, metadata={"symbol": symbol, "help": help, RANGE_KEY: interval}
    )


@dataclasses.dataclass(frozen=True)
class BaseHparams:
    """Base of every algorithm's hyperparameters: on construction, every ``Literal`` field
    must hold one of its choices, every number be finite and inside its :func:`hp` range,
    and :meth:`check` must pass (subclasses define no ``__post_init__`` of their own)."""

    def __post_init__(self) -> None:
        for item in dataclasses.fields(self):
            name, kind = item.name, field_type(type(self), item.name)
            value = getattr(self, name)
            if typing.get_origin(kind) is Literal:
                coerce(value, kind, f"algo.{name}")
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"algo.{name} must be a finite number, got {value}")
            interval = item.metadata.get(RANGE_KEY)
            if interval is not None and interval.text() and not interval.holds(value):
                raise ConfigError(f"algo.{name} must be {interval.text()}, got {value}")
        self.check()

    def check(self) -> None:
        """Raise :class:`ConfigError` where fields contradict each other (override; the
        ranges of single fields are their :func:`hp` declarations)."""


@dataclasses.dataclass(frozen=True)
class NoHparams(BaseHparams):
    """An algorithm without hyperparameters of its own."""


@dataclasses.dataclass(frozen=True)
class HparamInfo:
    """What a reader shows of one hyperparameter."""

    name: str
    type_text: str  # float, int, bool, str, or the choices "a | b"
    default: Any
    symbol: str  # the paper's symbol; empty where the paper has none
    meaning: str
    range_text: str  # ">= 0", "in (0, 1)"; empty where any value goes

    def summary(self) -> str:
        """Symbol, meaning and range on one line: ``τ temperature of ... (> 0)``."""
        interval = f"({self.range_text})" if self.range_text else ""
        return " ".join(part for part in (self.symbol, self.meaning, interval) if part)


def type_text(kind: Any) -> str:
    """A field type as a reader prints it: ``float``, or a choice's ``a | b``."""
    if typing.get_origin(kind) is Literal:
        return " | ".join(str(choice) for choice in typing.get_args(kind))
    return getattr(kind, "__name__", None) or str(kind).replace("typing.", "")


def describe_hparams(cls: type) -> list[HparamInfo]:
    """Every hyperparameter of ``cls`` in declaration order: the single reader of the
    :func:`hp` declarations (fields declared without one have empty symbol, meaning, range)."""
    infos = []
    for item in dataclasses.fields(cls):
        interval = item.metadata.get(RANGE_KEY)
        infos.append(
            HparamInfo(
                name=item.name,
                type_text=type_text(field_type(cls, item.name)),
                default=item.default,
                symbol=item.metadata.get("symbol", ""),
                meaning=item.metadata.get("help", ""),
                range_text=interval.text() if interval is not None else "",
            )
        )
    return infos


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


def make_hparams(cls: type, values: Mapping[str, Any], algorithm: str = "") -> BaseHparams:
    """Build and check ``cls`` from ``values`` (already coerced or raw text)."""
    coerced = {k: coerce_hparam(cls, k, v, algorithm) for k, v in values.items()}
    try:
        return cls(**coerced)
    except ValueError as exc:  # ConfigError is a ValueError; plain ones are rewrapped
        raise ConfigError(str(exc)) from None
