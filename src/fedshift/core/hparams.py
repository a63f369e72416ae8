"""Algorithm hyperparameters: one declaration per knob, validated in one place.

Every algorithm declares a frozen dataclass deriving from :class:`BaseHparams` whose
defaults are the paper's or the official code's values. Each field is an :func:`hp`
declaration holding its meaning, the paper's symbol and its allowed range; choice fields are
typed ``Literal[...]``. :meth:`BaseHparams.__post_init__` checks every choice and range with
one message style, and a subclass's :meth:`BaseHparams.check` keeps only the rules that tie
fields together. :func:`describe_hparams` is the one reader of the declarations (``fedshift
show``, ``--help``, the generated method pages). :func:`make_hparams` is the only way a run
builds one, so every bad value is a :class:`ConfigError` and never a traceback. A field may
also declare a random-search distribution (``search=log_uniform(1e-3, 1)``), which ``fedshift
sweep --random N`` draws from, as DomainBed's ``hparams_registry`` does.
"""

from __future__ import annotations

import dataclasses
import math
import random
import typing
from collections.abc import Mapping
from typing import Any, Literal

from fedshift.core.errors import ConfigError, did_you_mean
from fedshift.core.runconfig import coerce, field_type

#: the field-metadata key holding an :func:`hp` declaration's :class:`HparamRange`
RANGE_KEY = "range"
#: the field-metadata key holding an :func:`hp` declaration's :class:`Search`
SEARCH_KEY = "search"


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


@dataclasses.dataclass(frozen=True)
class Search:
    """A random-search distribution: ``log`` (log-uniform on [low, high]), ``uniform`` (on
    [low, high]), ``int`` (a uniform integer in [low, high]) or ``choice`` (one of
    ``choices``). Drawn floats keep 3 significant digits, so run folders name them exactly."""

    kind: Literal["log", "uniform", "int", "choice"]
    low: float = 0.0
    high: float = 0.0
    choices: tuple[Any, ...] = ()

    def draw(self, rng: random.Random) -> Any:
        """One value, from ``rng`` only (the same stream gives the same value)."""
        if self.kind == "choice":
            return self.choices[rng.randrange(len(self.choices))]
        if self.kind == "int":
            return rng.randint(int(self.low), int(self.high))
        if self.kind == "log":
            value = math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        else:
            value = rng.uniform(self.low, self.high)
        return float(f"{value:.3g}")

    def values(self) -> list[Any]:
        """The values a draw can take at the extremes (both bounds, or every choice)."""
        return list(self.choices) if self.kind == "choice" else [self.low, self.high]

    def text(self) -> str:
        """``log-uniform [0.001, 1]``, ``uniform [0.1, 1]``, ``integer [1, 4]``, ``one of a, b``."""
        if self.kind == "choice":
            return "one of " + ", ".join(str(c) for c in self.choices)
        name = {"log": "log-uniform", "uniform": "uniform", "int": "integer"}[self.kind]
        return f"{name} [{self.low:g}, {self.high:g}]"


def log_uniform(low: float, high: float) -> Search:
    """Search ``exp(U(log low, log high))``: for weights and step sizes spanning decades."""
    if not 0 < low < high:
        raise TypeError(f"log_uniform needs 0 < low < high, got {low}, {high}")
    return Search("log", low, high)


def uniform(low: float, high: float) -> Search:
    """Search ``U(low, high)``."""
    if not low < high:
        raise TypeError(f"uniform needs low < high, got {low}, {high}")
    return Search("uniform", low, high)


def integers(low: int, high: int) -> Search:
    """Search a uniform integer in ``[low, high]``."""
    if not low < high:
        raise TypeError(f"integers needs low < high, got {low}, {high}")
    return Search("int", low, high)


def one_of(*choices: Any) -> Search:
    """Search one of ``choices`` with equal probability."""
    if len(choices) < 2:
        raise TypeError("one_of needs at least two choices")
    return Search("choice", choices=tuple(choices))


def hp(
    default: Any,
    symbol: str = "",
    help: str = "",
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    search: Search | None = None,
) -> Any:
    """One hyperparameter: its default, the paper's ``symbol`` (empty where the paper has
    none), its meaning (``help``), its range (``low``/``high``, each closed unless
    ``low_open``/``high_open``), checked on construction of the dataclass, and optionally the
    distribution ``search`` that ``fedshift sweep --random`` draws it from."""
    if (low_open and low is None) or (high_open and high is None):
        raise TypeError("an open bound needs its value (low_open needs low, high_open high)")
    interval = HparamRange(low, high, low_open, high_open)
    if interval.text() and not interval.holds(default):
        raise TypeError(f"default {default!r} lies outside its own range {interval.text()}")
    if search is not None and interval.text():
        outside = [v for v in search.values() if not interval.holds(v)]
        if outside:
            raise TypeError(f"search {search.text()} leaves the range {interval.text()}")
    metadata = {"symbol": symbol, "help": help, RANGE_KEY: interval, SEARCH_KEY: search}
    return dataclasses.field(default=default, metadata=metadata)


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
    search_text: str = ""  # "log-uniform [0.001, 1]"; empty where --random leaves it fixed

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
                search_text=search.text() if (search := item.metadata.get(SEARCH_KEY)) else "",
            )
        )
    return infos


def search_spaces(cls: type) -> dict[str, Search]:
    """Field name -> its declared :class:`Search`, for the fields that declare one."""
    return {
        f.name: f.metadata[SEARCH_KEY]
        for f in dataclasses.fields(cls)
        if f.metadata.get(SEARCH_KEY) is not None
    }


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
