"""Model selection: which evaluated round a run reports, one small rule per method.

As DomainBed's ``model_selection.py``: each rule picks a round from the run's history.
``source-val`` (the default, training-domain validation: no target labels), ``last``,
``oracle`` (best target round; uses target labels, reported only as an upper bound) and
label-free scores an algorithm reports (``selection_score``, e.g. FACT's inter-domain
distance on the target client, reported as ``target_accuracy_<name>``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

History = Sequence[dict]


def evaluated(history: History) -> list[dict]:
    """The rounds with a (non-NaN) target accuracy."""
    return [h for h in history if not math.isnan(h.get("target_accuracy", math.nan))]


@dataclass(frozen=True)
class LastRound:
    """The final evaluated round."""

    name: str = "last"

    def pick(self, history: History) -> dict | None:
        rounds = evaluated(history)
        return rounds[-1] if rounds else None


@dataclass(frozen=True)
class BestRound:
    """The evaluated round with the best finite ``key`` (the first one on ties).

    Only rounds that report ``key`` compete (``source_eval_every`` scores the source
    validation split in some rounds only). Without any finite ``key``: the first evaluated
    round reporting it (else the first evaluated round) when ``required`` (the accuracy rules
    every run reports), else nothing (an algorithm's optional score).
    """

    name: str
    key: str
    higher_is_better: bool = True
    required: bool = True

    def pick(self, history: History) -> dict | None:
        candidates = evaluated(history)
        rounds = [h for h in candidates if math.isfinite(h.get(self.key, math.nan))]
        if not rounds:
            if not self.required:
                return None
            reported = [h for h in candidates if self.key in h]
            return (reported or candidates or [None])[0]
        sign = -1.0 if self.higher_is_better else 1.0
        return min(rounds, key=lambda h: sign * h[self.key])


SOURCE_VAL = BestRound("source-val", "source_val_accuracy")
ORACLE = BestRound("oracle", "target_accuracy")
LAST = LastRound()
#: the rules every run reports, by name
SELECTIONS = {rule.name: rule for rule in (SOURCE_VAL, LAST, ORACLE)}


def score_selection(name: str, lower_is_better: bool = True) -> BestRound:
    """The rule of an algorithm's label-free ``selection_score`` (e.g. ``min_idd``)."""
    return BestRound(name, "selection_score", higher_is_better=not lower_is_better, required=False)


#: how many final evaluated rounds ``target_accuracy_last5`` averages (FPL's reported metric)
LAST_ROUNDS_MEAN = 5


def mean_of_last(history: History, n: int = LAST_ROUNDS_MEAN) -> dict:
    """``target_accuracy`` and ``per_domain_accuracy`` averaged over the last ``n`` evaluated
    rounds (fewer when the run evaluated fewer): FPL reports this mean, not one round."""
    rounds = evaluated(history)[-n:]
    if not rounds:
        raise ValueError("no evaluated round in the history for the mean of the last rounds")
    scores: dict[str, list[float]] = {}  # a source domain only in the rounds that scored it
    for h in rounds:  # (source_eval_every > 1 scores the sources in some rounds only)
        for domain, value in (h.get("per_domain_accuracy") or {}).items():
            scores.setdefault(domain, []).append(value)
    return {
        "rounds": len(rounds),
        "target_accuracy": sum(h["target_accuracy"] for h in rounds) / len(rounds),
        "per_domain_accuracy": {d: sum(v) / len(v) for d, v in scores.items()},
    }


def select(history: History, rule: LastRound | BestRound) -> dict:
    """The round ``rule`` picks; a history without an evaluated round is an error."""
    picked = rule.pick(history)
    if picked is None:
        raise ValueError(f"no evaluated round in the history for selection {rule.name!r}")
    return picked
