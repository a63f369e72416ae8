"""In-process engine: clients run in this process, one after another (or vectorized)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

from fedshift.core.algorithm import Algorithm
from fedshift.core.context import ClientContext, TrainConfig
from fedshift.core.record import Record
from fedshift.engine.assembly import Experiment
from fedshift.engine.evaluation import ClientScores, client_scores
from fedshift.engine.federation import (
    BaseFederation,
    federation_options,
    one_line,
    run_client_task,
)
from fedshift.engine.simulation.faults import InjectedFault
from fedshift.engine.simulation.tampering import Tampering
from fedshift.engine.simulation.vectorized import (
    run_vectorized,
    vectorize_blocker,
    vectorize_enabled,
    vectorize_wanted,
)

log = logging.getLogger(__name__)

#: ``(context, with_domains) -> scores`` of one client's personal model, or None
ScoreClient = Callable[[ClientContext, bool], ClientScores | None]


class SimulationFederation(BaseFederation):
    """Runs client tasks in-process with per-(round, client, call) seeded RNGs; personal
    models are scored from the client states held here.

    A client task that raises is a failed client (its message logged in one line); the
    failure policy decides the round. ``tampering``
    (:mod:`~fedshift.engine.simulation.tampering`) injects client faults for tests and drills
    and makes some clients malicious.
    """

    def __init__(
        self,
        algorithm: Algorithm,
        contexts: dict[int, ClientContext],
        *,
        score_client: ScoreClient | None = None,
        vectorize: bool = False,
        tampering: Tampering | None = None,
        **options,
    ):
        super().__init__(algorithm, {cid: ctx.role for cid, ctx in contexts.items()}, **options)
        self.contexts = contexts
        self.score_client = score_client
        self.vectorize = vectorize
        self.tampering = tampering or Tampering()
        #: replies that missed their round's deadline: (round, call, client); never used
        self.late: list[tuple[int, int, int]] = []

    @classmethod
    def for_experiment(cls, exp: Experiment) -> SimulationFederation:
        def score(ctx: ClientContext, with_domains: bool) -> ClientScores | None:
            return client_scores(exp, ctx, with_domains)

        settings = (exp.precision.name, exp.cfg.compile, TrainConfig.of(exp.cfg))
        vectorize = vectorize_enabled(exp.cfg.vectorize, exp.device, *settings)
        blocker = vectorize_blocker(*settings)
        if vectorize_wanted(exp.cfg.vectorize, exp.device) and blocker:
            # on: the user asked for it; auto: a CUDA run that would have been vectorized
            level = logging.WARNING if exp.cfg.vectorize == "on" else logging.INFO
            log.log(level, "vectorize=%s: clients run sequentially; %s", exp.cfg.vectorize, blocker)
        return cls(
            exp.algorithm,
            exp.contexts,
            score_client=score,
            vectorize=vectorize,
            tampering=Tampering.for_experiment(exp),
            **federation_options(exp),
        )

    def _dispatch(
        self, task: str, sends: dict[int, Record], call_index: int
    ) -> Iterator[tuple[int, Record]]:
        """Clients one after another, each reply handed on before the next client runs;
        vectorized clients, or a call with faults or an attack (which need every reply,
        e.g. ALIE's mean), hand theirs on together."""
        for round_, call, cid in self.late:
            log.warning(
                "round %s: client %s's reply to round %s call %s arrived late; discarded",
                self.round,
                cid,
                round_,
                call,
            )
        self.late = []
        faulty = self.tampering.fault_kinds(self.round, sends)
        replies: dict[int, Record] = {}
        if self.vectorize and not any(faulty.values()):
            try:
                together = run_vectorized(
                    self.algorithm,
                    self.contexts,
                    task,
                    sends,
                    seed=self.seed,
                    round_=self.round,
                    call_index=call_index,
                    total_rounds=self.total_rounds,
                )
            except Exception as exc:  # a client's failure inside the batch: run one by one
                log.warning(
                    "round %s: vectorized %r failed (%s); running clients one by one",
                    self.round,
                    task,
                    one_line(exc),
                )
                together = None
            if together is not None:
                self.tampering.apply(sends, together, {})
                yield from _in_order(sends, together)
                return
        hold = any(faulty.values()) or self.tampering.attack is not None
        for cid, sent in sends.items():
            kinds = faulty.get(cid, ())
            try:
                if "raise" in kinds:
                    raise InjectedFault(f"injected fault in task {task!r}")
                reply = run_client_task(
                    self.algorithm,
                    self.contexts[cid],
                    task,
                    sent,
                    seed=self.seed,
                    round_=self.round,
                    call_index=call_index,
                    total_rounds=self.total_rounds,
                )
            except Exception as exc:  # the client failed; the policy decides the round
                self._fail(cid, task, f"raised {one_line(exc)}")
                continue
            if "drop" in kinds:
                self._fail(cid, task, "no reply (dropped)")
                continue
            if "straggle" in kinds:
                self.late.append((self.round, call_index, cid))
                self._fail(cid, task, "no reply before the round's deadline (straggler)")
                continue
            if hold:
                replies[cid] = reply
            else:
                yield cid, reply
        self.tampering.apply(sends, replies, faulty)
        yield from _in_order(sends, replies)

    def score_clients(self, with_domains: bool) -> dict[int, ClientScores]:
        if self.score_client is None:
            return {}
        found = {cid: self.score_client(ctx, with_domains) for cid, ctx in self.contexts.items()}
        return {cid: s for cid, s in found.items() if s is not None}


def _in_order(sends: dict[int, Record], replies: dict[int, Record]) -> Iterator[tuple[int, Record]]:
    """The replies in the order of ``sends``, each let go of once handed on."""
    for cid in sends:
        if cid in replies:
            yield cid, replies.pop(cid)
