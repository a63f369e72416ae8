"""In-process engine: clients run in this process, one after another."""

from __future__ import annotations

from collections.abc import Callable

from fedshift.core.algorithm import Algorithm
from fedshift.core.context import ClientContext
from fedshift.core.record import Record
from fedshift.engine.assembly import Experiment
from fedshift.engine.evaluation import ClientScores, client_scores
from fedshift.engine.federation import BaseFederation, federation_options, run_client_task
from fedshift.engine.vectorized import run_vectorized, vectorize_enabled

#: ``(context, with_domains) -> scores`` of one client's personal model, or None
ScoreClient = Callable[[ClientContext, bool], ClientScores | None]


class SimulationFederation(BaseFederation):
    """Runs client tasks in-process with per-(round, client, call) seeded RNGs; personal
    models are scored from the client states held here."""

    def __init__(
        self,
        algorithm: Algorithm,
        contexts: dict[int, ClientContext],
        *,
        score_client: ScoreClient | None = None,
        vectorize: bool = False,
        **options,
    ):
        super().__init__(algorithm, {cid: ctx.role for cid, ctx in contexts.items()}, **options)
        self.contexts = contexts
        self.score_client = score_client
        self.vectorize = vectorize

    @classmethod
    def for_experiment(cls, exp: Experiment) -> SimulationFederation:
        def score(ctx: ClientContext, with_domains: bool) -> ClientScores | None:
            return client_scores(exp, ctx, with_domains)

        vectorize = vectorize_enabled(exp.cfg.vectorize, exp.device)
        return cls(
            exp.algorithm,
            exp.contexts,
            score_client=score,
            vectorize=vectorize,
            **federation_options(exp),
        )

    def _dispatch(self, task: str, sends: dict[int, Record], call_index: int) -> dict[int, Record]:
        if self.vectorize:
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
            if together is not None:
                return together
        return {
            cid: run_client_task(
                self.algorithm,
                self.contexts[cid],
                task,
                sent,
                seed=self.seed,
                round_=self.round,
                call_index=call_index,
                total_rounds=self.total_rounds,
            )
            for cid, sent in sends.items()
        }

    def score_clients(self, with_domains: bool) -> dict[int, ClientScores]:
        if self.score_client is None:
            return {}
        found = {cid: self.score_client(ctx, with_domains) for cid, ctx in self.contexts.items()}
        return {cid: s for cid, s in found.items() if s is not None}
