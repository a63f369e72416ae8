"""Tampering with what simulated clients send: injected faults and malicious clients, behind
one interface the in-process engine asks per call.

Faults (:mod:`~fedshift.engine.simulation.faults`, run key ``faults``) break a reply or its
delivery; attacks (:mod:`~fedshift.engine.simulation.attacks`, run key ``attack``) send a
well-formed malicious one. Attacks apply first, then the faults' corruptions, so a faulty
attacker is both.
"""

from __future__ import annotations

from collections.abc import Mapping

from fedshift.core.record import Record
from fedshift.engine.assembly import Experiment
from fedshift.engine.simulation.attacks import AttackPlan
from fedshift.engine.simulation.faults import CORRUPTIONS, FaultPlan


class Tampering:
    """The run's faults and attack (either may be None)."""

    def __init__(self, faults: FaultPlan | None = None, attack: AttackPlan | None = None):
        self.faults = faults
        self.attack = attack

    @classmethod
    def for_experiment(cls, exp: Experiment) -> Tampering:
        attack = AttackPlan.from_config(
            exp.cfg, exp.contexts, exp.algorithm.shares, exp.dataset.num_classes
        )
        return cls(FaultPlan.from_text(exp.cfg.faults), attack)

    def fault_kinds(self, round_: int, clients) -> dict[int, list[str]]:
        """Client id -> the fault kinds it suffers in ``round_`` (empty without faults)."""
        if self.faults is None:
            return {}
        return {cid: self.faults.kinds(round_, cid) for cid in clients}

    def apply(
        self,
        sends: Mapping[int, Record],
        replies: dict[int, Record],
        kinds: Mapping[int, list[str]],
    ) -> None:
        """Change ``replies`` in place: the attack, then each client's corruptions."""
        if self.attack is not None:
            self.attack.apply(sends, replies)
        for cid, reply in replies.items():
            for kind in kinds.get(cid, ()):
                CORRUPTIONS[kind](reply)
