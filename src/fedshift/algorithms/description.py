"""One reader of an algorithm's description: ``fedshift show``, ``fedshift list algorithms``
and the generated method pages all print what :func:`describe_algorithm` returns, so they
cannot disagree (a page once listed a parent's problems that ``show`` and a run refuse)."""

from __future__ import annotations

import dataclasses
import inspect

from fedshift.algorithms import get_algorithm, origin_of
from fedshift.core.hparams import HparamInfo, describe_hparams
from fedshift.core.runconfig import RunConfig
from fedshift.scenarios import PROTOCOLS

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


def describe_algorithm(name: str) -> AlgorithmDescription:
    """The description of algorithm ``name`` (built-in, registered or plug-in)."""
    cls = get_algorithm(name)
    doc = inspect.getdoc(cls) or ""
    return AlgorithmDescription(
        name=name,
        paper=cls.paper or "",
        origin=origin_of(name),
        summary=doc.split("\n\n")[0],
        shares={key: kind.value for key, kind in cls.shares.items()},
        pooled=cls.pooled,
        protocols=tuple(cls.protocols or PROTOCOLS),
        problems=cls.supported_problems(),
        default_model=cls.default_model or RunConfig().model,
        names_default_model=bool(cls.default_model),
        personal=cls.personal,
        hparams=describe_hparams(cls.Hparams),
        qualname=f"{cls.__module__}.{cls.__qualname__}",
    )
