"""One reader of an algorithm's description: ``fedshift show``, ``fedshift list algorithms``
and the generated method pages all print what :func:`describe_algorithm` returns, so they
cannot disagree (a page once listed a parent's problems that ``show`` and a run refuse).

A built-in whose module is not imported yet is described from its declaration in
:mod:`fedshift.algorithms.builtin_descriptions` (what :func:`declaration` read from the class
when that file was generated), so ``list`` and ``show`` load no torch; once imported, from the
class itself. ``tests/algorithms/test_builtin_descriptions.py`` fails when the two differ."""

from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING, Any

from fedshift.algorithms import BUILTINS, REGISTRY, get_algorithm, origin_of
from fedshift.core.hparams import HparamInfo, describe_hparams
from fedshift.core.runconfig import RunConfig
from fedshift.scenarios import PROTOCOLS

if TYPE_CHECKING:  # imports torch; a built-in is described without it
    from fedshift.core.algorithm import Algorithm

#: what a pooled algorithm shares (it is not federated)
POOLED_SHARES = "nothing (pooled data, not federated)"


@dataclasses.dataclass(frozen=True)
class AlgorithmDescription:
    """What a reader shows of one algorithm."""

    name: str
    paper: str
    origin: str  # built-in, plug-in (its package), registered or import path
    summary: str  # the class docstring's first paragraph
    shares: dict[str, str]  # reply key -> kind; empty for a pooled algorithm
    pooled: bool
    protocols: tuple[str, ...]
    problems: tuple[str, ...]  # the problems a run accepts (Algorithm.supported_problems)
    default_model: str  # the run default where the class names none
    names_default_model: bool  # whether the class names its own default model
    personal: bool  # each client's own model is evaluated instead of a global one
    hparams: list[HparamInfo]
    qualname: str  # module.Class, for the API reference

    def shares_text(self, separator: str = " ") -> str:
        """``model (model), ...``; ``separator=":"`` gives ``model:model``; or why nothing."""
        if self.pooled:
            return POOLED_SHARES
        if separator == ":":
            return ", ".join(f"{k}:{v}" for k, v in self.shares.items()) or "nothing"
        return ", ".join(f"{k} ({v})" for k, v in self.shares.items()) or "nothing"


def declaration(cls: type[Algorithm]) -> dict[str, Any]:
    """What a description reads from algorithm class ``cls``, as Python literals (the form
    :mod:`fedshift.algorithms.builtin_descriptions` keeps for each built-in)."""
    doc = inspect.getdoc(cls) or ""
    return {
        "paper": cls.paper or "",
        "summary": doc.split("\n\n")[0],
        "shares": {key: kind.value for key, kind in cls.shares.items()},
        "pooled": cls.pooled,
        "protocols": tuple(cls.protocols),
        "problems": cls.supported_problems(),
        "default_model": cls.default_model,
        "personal": cls.personal,
        "hparams": [
            {item.name: getattr(info, item.name) for item in dataclasses.fields(info)}
            for info in describe_hparams(cls.Hparams)
        ],
        "qualname": f"{cls.__module__}.{cls.__qualname__}",
    }


def describe_algorithm(name: str) -> AlgorithmDescription:
    """The description of algorithm ``name`` (built-in, registered or plug-in)."""
    if name in BUILTINS and not REGISTRY.loaded(name):
        from fedshift.algorithms.builtin_descriptions import DECLARATIONS

        declared = DECLARATIONS[name]
    else:
        declared = declaration(get_algorithm(name))
    return AlgorithmDescription(
        name=name,
        paper=declared["paper"],
        origin=origin_of(name),
        summary=declared["summary"],
        shares=dict(declared["shares"]),
        pooled=declared["pooled"],
        protocols=tuple(declared["protocols"] or PROTOCOLS),
        problems=tuple(declared["problems"]),
        default_model=declared["default_model"] or RunConfig().model,
        names_default_model=bool(declared["default_model"]),
        personal=declared["personal"],
        hparams=[HparamInfo(**info) for info in declared["hparams"]],
        qualname=declared["qualname"],
    )
