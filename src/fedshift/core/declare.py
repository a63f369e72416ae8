"""Declared fields: the metadata one declaration carries (meaning, the paper's symbol, an
allowed range, a random-search distribution) and the search distributions themselves.

Both kinds of declared settings build on :func:`declared`: an algorithm's hyperparameters
(:func:`fedshift.core.hparams.hp`) and the run keys (:func:`fedshift.core.runconfig.key`),
so one reader describes them, one loop checks their ranges and ``fedshift sweep --random``
draws both from their own declarations.
"""

from __future__ import annotations

import dataclasses
import math
import random
import types
import typing
from typing import Any, Literal

#: the field-metadata key holding a declaration's :class:`HparamRange`
RANGE_KEY = "range"
#: the field-metadata key holding a declaration's :class:`Search`
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


def declared(
    default: Any,
    symbol: str = "",
    help: str = "",
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    search: Search | None = None,
    **extra: Any,
) -> Any:
    """A dataclass field with its default, the paper's ``symbol``, its meaning (``help``), its
    range (``low``/``high``, each closed unless ``low_open``/``high_open``), the distribution
    ``search`` that ``fedshift sweep --random`` draws it from, and ``extra`` metadata. A
    declaration contradicting itself (an open bound without a value, a default or a search
    outside the range) is a TypeError when the class is defined."""
    if (low_open and low is None) or (high_open and high is None):
        raise TypeError("an open bound needs its value (low_open needs low, high_open high)")
    interval = HparamRange(low, high, low_open, high_open)
    if interval.text() and not interval.holds(default):
        raise TypeError(f"default {default!r} lies outside its own range {interval.text()}")
    if search is not None and interval.text():
        outside = [v for v in search.values() if not interval.holds(v)]
        if outside:
            raise TypeError(f"search {search.text()} leaves the range {interval.text()}")
    metadata = {"symbol": symbol, "help": help, RANGE_KEY: interval, SEARCH_KEY: search, **extra}
    return dataclasses.field(default=default, metadata=metadata)


def search_spaces(cls: type) -> dict[str, Search]:
    """Field name -> its declared :class:`Search`, for the fields that declare one."""
    return {
        f.name: f.metadata[SEARCH_KEY]
        for f in dataclasses.fields(cls)
        if f.metadata.get(SEARCH_KEY) is not None
    }


def field_type(cls: type, name: str) -> Any:
    """The declared type of dataclass field ``name`` (``X | None`` -> ``X``; a per-domain
    union such as ``int | str`` is kept whole, for :func:`fedshift.core.runconfig.coerce`)."""
    hint = typing.get_type_hints(cls)[name]
    if isinstance(hint, types.UnionType) and type(None) in typing.get_args(hint):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return hint


def type_text(kind: Any) -> str:
    """A field type as a reader prints it: ``float``, or a choice's ``a | b``."""
    if typing.get_origin(kind) is Literal:
        return " | ".join(str(choice) for choice in typing.get_args(kind))
    return getattr(kind, "__name__", None) or str(kind).replace("typing.", "")


@dataclasses.dataclass(frozen=True)
class FieldInfo:
    """What a reader shows of one declared field (a hyperparameter or a run key)."""

    name: str
    type_text: str  # float, int, bool, str, or the choices "a | b"
    default: Any
    symbol: str  # the paper's symbol; empty where the paper has none
    meaning: str
    range_text: str  # ">= 0", "in (0, 1)"; empty where any value goes
    search_text: str = ""  # "log-uniform [0.001, 1]"; empty where --random leaves it fixed
    group: str = ""  # a run key's section (training, partition, ...); empty for others
    resume: str = ""  # a run key's resume rule (fixed, may-change, may-grow)

    def summary(self) -> str:
        """Symbol, meaning and range on one line: ``τ temperature of ... (> 0)``."""
        interval = f"({self.range_text})" if self.range_text else ""
        return " ".join(part for part in (self.symbol, self.meaning, interval) if part)


def describe_fields(cls: type, names: typing.Iterable[str] | None = None) -> list[FieldInfo]:
    """The declared fields of dataclass ``cls`` (those of ``names``, else all) in declaration
    order: the one reader of the declarations (a field declared without one has empty
    symbol, meaning and range)."""
    chosen = None if names is None else set(names)
    infos = []
    for item in dataclasses.fields(cls):
        if chosen is not None and item.name not in chosen:
            continue
        interval = item.metadata.get(RANGE_KEY)
        search = item.metadata.get(SEARCH_KEY)
        infos.append(
            FieldInfo(
                name=item.name,
                type_text=type_text(field_type(cls, item.name)),
                default=item.default,
                symbol=item.metadata.get("symbol", ""),
                meaning=item.metadata.get("help", ""),
                range_text=interval.text() if interval is not None else "",
                search_text=search.text() if search is not None else "",
                group=item.metadata.get("group", ""),
                resume=item.metadata.get("resume", ""),
            )
        )
    return infos
