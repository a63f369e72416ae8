"""Declared fields: the metadata one declaration carries (meaning, the paper's symbol, an
allowed range, a random-search distribution) and the search distributions themselves.

Both kinds of declared settings build on :func:`declared`: an algorithm's hyperparameters
(:func:`fedshift.core.hparams.hp`) and the run keys (:func:`fedshift.core.runconfig.key`),
so one reader describes them, one loop checks their ranges and ``fedshift sweep --random``
draws both from their own declarations.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import random
import types
import typing
from typing import Any, Literal

from fedshift.core.errors import ConfigError, did_you_mean

#: the field-metadata key holding a declaration's :class:`HparamRange`
RANGE_KEY = "range"
#: the field-metadata key holding a declaration's :class:`Search`
SEARCH_KEY = "search"
#: the field-metadata key naming the registry (``module:attribute``) whose names a
#: declaration's help lists where it says ``{choices}``
CHOICES_KEY = "choices"
#: where a help text lists the names of its ``choices`` registry
CHOICES_MARK = "{choices}"


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


def registry_names(spec: str) -> list[str]:
    """The names of the registry ``module:attribute`` names (its keys, or its items), read
    now: a field's help lists what the registry holds when it is described, plug-ins and
    later additions included, and ``core`` imports no upper layer to say it."""
    module, _, attribute = spec.partition(":")
    registry: Any = importlib.import_module(module)
    for part in attribute.split("."):
        registry = getattr(registry, part)
    return [str(name) for name in registry]


def help_text(metadata: typing.Mapping[str, Any]) -> str:
    """A declaration's help, its ``{choices}`` replaced by the names of its registry."""
    text = metadata.get("help", "")
    spec = metadata.get(CHOICES_KEY)
    return text.replace(CHOICES_MARK, ", ".join(registry_names(spec))) if spec else text


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
                meaning=help_text(item.metadata),
                range_text=interval.text() if interval is not None else "",
                search_text=search.text() if search is not None else "",
                group=item.metadata.get("group", ""),
                resume=item.metadata.get("resume", ""),
            )
        )
    return infos


# -- checking values against their declarations (run keys and hyperparameters alike)

#: the per-domain field types: one number for every domain, or "DOMAIN:NUMBER,..."
PER_DOMAIN_KINDS = {int | str: int, float | str: float}


def parse_per_domain(text: str, number: type, key: str) -> dict[str, int | float]:
    """``"mnist:3,usps:7"`` -> ``{"mnist": 3, "usps": 7}``; a one-line ConfigError for a
    malformed item, a repeated domain or a value that is not a ``number``."""
    values: dict[str, int | float] = {}
    for item in text.split(","):
        domain, sep, raw = (part.strip() for part in item.partition(":"))
        if not sep or not domain or not raw:
            raise ConfigError(
                f"{key} {text!r}: item {item.strip()!r} is not DOMAIN:{number.__name__.upper()}"
                f" (e.g. {key}=mnist:3,usps:7, or one {number.__name__} for every domain)"
            )
        if domain in values:
            raise ConfigError(f"{key} {text!r} names domain {domain!r} twice")
        values[domain] = coerce_number(raw, number, f"{key} of domain {domain!r}")
    return values


def coerce_number(value: Any, number: type, key: str) -> int | float:
    """``value`` as an int or float (an int takes no fraction, neither takes a bool)."""
    try:
        if isinstance(value, bool):
            raise ValueError(value)
        if number is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{key} expects {number.__name__}, got {value!r}") from None


def coerce_per_domain(value: Any, number: type, key: str) -> int | float | str:
    """A per-domain key's value: one number, or a ``DOMAIN:NUMBER`` list (or a mapping, from
    Python or a ``--config`` table) normalized to ``"a:1,b:2"`` (so files, ``--set`` and a
    resumed config.json compare equal)."""
    if isinstance(value, dict):
        value = ",".join(f"{domain}:{n}" for domain, n in value.items())
    if isinstance(value, str) and ":" in value:
        items = parse_per_domain(value, number, key)
        return ",".join(f"{domain}:{n}" for domain, n in items.items())
    try:
        return coerce_number(value, number, key)
    except ConfigError:
        kind = number.__name__
        raise ConfigError(
            f"{key} expects {kind} or DOMAIN:{kind.upper()},... (e.g. mnist:3,usps:7), "
            f"got {value!r}"
        ) from None


def per_domain_value(
    value: int | float | str, key: str, domains: typing.Sequence[str], default: int | float
) -> dict[str, int | float]:
    """Every domain of ``domains`` -> its value of per-domain key ``key``: the one number, or
    the listed one (``default`` for a domain not listed); a listed name that is not one of
    ``domains`` is a ConfigError naming the valid ones."""
    if not isinstance(value, str):
        return dict.fromkeys(domains, value)
    number = int if isinstance(default, int) else float
    listed = parse_per_domain(value, number, key)
    for domain in listed:
        if domain not in domains:
            raise ConfigError(
                f"{key} names unknown domain {domain!r}{did_you_mean(domain, list(domains))}; "
                f"domains: {', '.join(domains)}"
            )
    return {domain: listed.get(domain, default) for domain in domains}


def coerce(value: Any, kind: Any, key: str) -> Any:
    """Convert a TOML or command-line value to the field's type, or raise ConfigError.

    ``kind`` is ``bool``, ``int``, ``float``, ``str``, a ``Literal[...]`` of strings
    (a choice: any other value is an error naming the choices, as :func:`check_choice`) or a
    per-domain union (:data:`PER_DOMAIN_KINDS`, see :func:`coerce_per_domain`).
    """
    if kind in PER_DOMAIN_KINDS:
        return coerce_per_domain(value, PER_DOMAIN_KINDS[kind], key)
    if typing.get_origin(kind) is Literal:
        text = str(value)
        check_choice(key, text, typing.get_args(kind))
        return text
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            return int(value)
        if kind is float:
            return float(value)
        if kind is str:
            return str(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{key} expects {kind.__name__}, got {value!r}") from None
    return value


def check_choice(key: str, value: str, choices: typing.Iterable[str]) -> None:
    """Raise ConfigError naming the choices unless ``value`` is one of them."""
    choices = tuple(choices)
    if value not in choices:
        raise ConfigError(
            f"unknown {key} {value!r}{did_you_mean(value, choices)}; "
            f"choose one of: {', '.join(choices)}"
        )


def check_declared(obj: Any, prefix: str = "") -> None:
    """Check every declared field of dataclass ``obj`` (a run config, an algorithm's
    hyperparameters) against its declaration, with one message style: a ``Literal`` field
    holds one of its choices, a number is finite and inside its range (a per-domain value,
    ``DOMAIN:N,...``, domain by domain). Messages name the field as ``prefix + name``."""
    for item in dataclasses.fields(obj):
        name, kind = prefix + item.name, field_type(type(obj), item.name)
        value = getattr(obj, item.name)
        if typing.get_origin(kind) is Literal:
            coerce(value, kind, name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value}")
        interval = item.metadata.get(RANGE_KEY)
        if interval is None or not interval.text():
            continue
        if kind in PER_DOMAIN_KINDS and isinstance(value, str):
            items = parse_per_domain(value, PER_DOMAIN_KINDS[kind], name).items()
            values = [(f" of domain {domain!r}", number) for domain, number in items]
        else:
            values = [("", value)]
        for where, number in values:
            if isinstance(number, int | float) and not interval.holds(number):
                raise ConfigError(f"{name}{where} must be {interval.text()}, got {number}")
