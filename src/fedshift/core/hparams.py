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
from collections.abc import Mapping
from typing import Any

from fedshift.core.declare import (
    RANGE_KEY,
    SEARCH_KEY,
    FieldInfo,
    HparamRange,
    Search,
    check_declared,
    coerce,
    declared,
    describe_fields,
    field_type,
    integers,
    log_uniform,
    one_of,
    search_spaces,
    type_text,
    uniform,
)
from fedshift.core.errors import ConfigError, did_you_mean

__all__ = [
    "RANGE_KEY",
    "SEARCH_KEY",
    "BaseHparams",
    "HparamInfo",
    "HparamRange",
    "NoHparams",
    "Search",
    "coerce_hparam",
    "describe_hparams",
    "hp",
    "hparam_types",
    "integers",
    "log_uniform",
    "make_hparams",
    "one_of",
    "search_spaces",
    "type_text",
    "uniform",
]

#: what a reader shows of one hyperparameter
HparamInfo = FieldInfo


#: one hyperparameter: its default, the paper's ``symbol`` (empty where the paper has none),
#: its meaning (``help``), its range (``low``/``high``, each closed unless ``low_open``/
#: ``high_open``), checked on construction of the dataclass, and optionally the distribution
#: ``search`` that ``fedshift sweep --random`` draws it from (:func:`declared`)
hp = declared


@dataclasses.dataclass(frozen=True)
class BaseHparams:
    """Base of every algorithm's hyperparameters: on construction, every ``Literal`` field
    must hold one of its choices, every number be finite and inside its :func:`hp` range,
    and :meth:`check` must pass (subclasses define no ``__post_init__`` of their own)."""

    def __post_init__(self) -> None:
        check_declared(self, "algo.")
        self.check()

    def check(self) -> None:
        """Raise :class:`ConfigError` where fields contradict each other (override; the
        ranges of single fields are their :func:`hp` declarations)."""


@dataclasses.dataclass(frozen=True)
class NoHparams(BaseHparams):
    """An algorithm without hyperparameters of its own."""


def describe_hparams(cls: type) -> list[HparamInfo]:
    """Every hyperparameter of ``cls`` in declaration order: the single reader of the
    :func:`hp` declarations (fields declared without one have empty symbol, meaning, range)."""
    return describe_fields(cls)


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
