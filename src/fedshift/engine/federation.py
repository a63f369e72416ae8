"""The federation base every engine shares: sampling, reply validation, the failure policy
and byte counting. Engines (:mod:`~fedshift.engine.simulation`, :mod:`~fedshift.engine.flower`)
are sibling subclasses that only dispatch a call to their clients and score personal models
where the client states live.
"""

from __future__ import annotations

import contextlib
import logging
from abc import abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from fedshift.core.algorithm import Algorithm
from fedshift.core.context import ClientContext
from fedshift.core.errors import RoundFailed
from fedshift.core.federation import Federation
from fedshift.core.record import Kind, Record, share_key
from fedshift.core.seeding import derive_seed, numpy_generator, seed_torch
from fedshift.engine.assembly import Experiment
from fedshift.engine.evaluation import ClientScores

log = logging.getLogger(__name__)


def validate_reply(reply: Record, shares: Mapping[str, object]) -> str | None:
    """Why a reply must be rejected (undeclared key, NaN/Inf), or None when it is fine."""
    if not isinstance(reply, Record):
        return f"reply is {type(reply).__name__}, not a Record"
    for key in reply.arrays:
        if share_key(key) not in shares:
            return f"array {key!r} is not declared in shares ({', '.join(shares) or 'nothing'})"
    bad = reply.check_finite()
    if bad is not None:
        return f"{bad!r} holds NaN or Inf"
    return None


#: kinds holding one row per sample: their leading dimension is each client's sample count
PER_SAMPLE_KINDS = (Kind.AMPLITUDE, Kind.FEATURES, Kind.LOGITS)


def check_shapes(
    replies: dict[int, Record], shares: Mapping[str, object] | None = None
) -> dict[int, str]:
    """Clients whose array shapes disagree with the majority of this call's replies.

    Arrays of a per-sample kind (in ``shares``) are compared without their leading dimension.
    """
    per_sample = {k for k, kind in (shares or {}).items() if kind in PER_SAMPLE_KINDS}
    shapes: dict[str, dict[tuple, list[int]]] = {}
    for cid, reply in replies.items():
        for key, value in reply.arrays.items():
            shape = tuple(value.shape)[1 if share_key(key) in per_sample else 0 :]
            shapes.setdefault(key, {}).setdefault(shape, []).append(cid)
    bad: dict[int, str] = {}
    for key, by_shape in shapes.items():
        if len(by_shape) > 1:
            common = max(by_shape, key=lambda s: len(by_shape[s]))
            for shape, cids in by_shape.items():
                if shape != common:
                    for cid in cids:
                        bad[cid] = f"{key!r} has shape {shape}, others {common}"
    return bad


def run_client_task(
    algorithm: Algorithm,
    ctx: ClientContext,
    task: str,
    sent: Record,
    *,
    seed: int,
    round_: int,
    call_index: int,
    total_rounds: int,
) -> Record:
    """Run one client task with the RNGs derived from (seed, client, round, call index).

    Every engine calls this, so a client computes the same reply wherever it runs.
    """
    ctx.round = round_
    ctx.total_rounds = total_rounds
    ctx.rng = torch.Generator().manual_seed(
        derive_seed(seed, "client", ctx.client_id, round_, call_index)
    )
    record = Record(
        arrays={k: v.clone() for k, v in sent.arrays.items()},
        config=dict(sent.config),
        metrics=dict(sent.metrics),
    )
    devices = [ctx.device] if ctx.device.type == "cuda" else []
    leasing = getattr(ctx.build_model, "leasing", contextlib.nullcontext)
    with torch.random.fork_rng(devices=devices), leasing():
        seed_torch(derive_seed(seed, "torch", ctx.client_id, round_, call_index), ctx.device)
        return algorithm.run_task(task, ctx, record)


def federation_options(exp: Experiment) -> dict[str, Any]:
    """The run config's settings of a federation (every engine's)."""
    cfg = exp.cfg
    return {
        "seed": cfg.seed,
        "fraction": cfg.fraction,
        "failure_policy": cfg.failure_policy,
        "min_clients": cfg.min_clients,
        "count_bytes": not exp.algorithm.pooled,
        "total_rounds": cfg.rounds,
    }


class BaseFederation(Federation):
    """What every engine shares; subclasses implement :meth:`_dispatch` and
    :meth:`score_clients`.

    Sampling is seeded per (round, call); every reply is validated against the algorithm's
    ``shares`` (declared keys, finite values, shapes agreeing across the call); bytes up
    and down are counted; the failure policy is ``strict`` (every called client must
    succeed), ``dynamic`` (at least ``min_clients``) or ``resilient`` (go on with whoever
    replied).
    """

    def __init__(
        self,
        algorithm: Algorithm,
        roles: Mapping[int, str],
        *,
        seed: int,
        fraction: float = 1.0,
        failure_policy: str = "dynamic",
        min_clients: int = 1,
        count_bytes: bool = True,
        total_rounds: int = 1,
        shared_shapes: bool = True,
    ):
        self.algorithm = algorithm
        self.roles = dict(roles)
        self.seed = seed
        self.fraction = fraction
        self.failure_policy = failure_policy
        self.min_clients = min_clients
        self.count_bytes = count_bytes
        self.total_rounds = total_rounds
        self.shared_shapes = shared_shapes
        self.round = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.samples = 0
        self.failures: list[str] = []
        self.seen_shares: set[str] = set()
        self._calls = 0

    # -- what engines implement -----------------------------------------------------------
    @abstractmethod
    def _dispatch(self, task: str, sends: dict[int, Record], call_index: int) -> dict[int, Record]:
        """Run client task ``task`` on every client of ``sends``; the clients that replied
        (a client left out has failed and was reported with :meth:`_fail`)."""

    @abstractmethod
    def score_clients(self, with_domains: bool) -> dict[int, ClientScores]:
        """Each client's personal model scored where its state lives (clients without
        one are left out): ``val``, ``test`` and, ``with_domains``, ``domain.<name>``."""

    # -- shared ----------------------------------------------------------------------------
    def begin_round(self, round_: int) -> None:
        self.round = round_
        self._calls = 0
        self.failures = []

    def clients(self, role: str = "source") -> list[int]:
        return [cid for cid, r in self.roles.items() if role == "all" or r == role]

    def sample(self, k: int | None = None, role: str = "source") -> list[int]:
        pool = self.clients(role)
        if k is None:
            k = max(1, round(self.fraction * len(pool))) if role == "source" else len(pool)
        if k >= len(pool):
            return pool
        rng = numpy_generator(self.seed, "sample", role, self.round, self._calls)
        return sorted(int(i) for i in rng.choice(pool, size=k, replace=False))

    def call(
        self, task: str, ids: Sequence[int], record: Record | Mapping[int, Record]
    ) -> dict[int, Record]:
        call_index = self._calls
        self._calls += 1
        sends = {cid: record[cid] if isinstance(record, Mapping) else record for cid in ids}
        if self.count_bytes:
            self.bytes_down += sum(sent.nbytes() for sent in sends.values())
        raw = self._dispatch(task, sends, call_index)
        replies: dict[int, Record] = {}
        for cid in ids:
            if cid not in raw:
                continue
            reply = raw[cid]
            problem = validate_reply(reply, self.algorithm.shares)
            if problem:
                self._fail(cid, task, problem)
                continue
            reply.arrays = {k: v.detach().to("cpu") for k, v in reply.arrays.items()}
            replies[cid] = reply
        if self.shared_shapes:
            for cid, problem in check_shapes(replies, self.algorithm.shares).items():
                self._fail(cid, task, problem)
                del replies[cid]
        for reply in replies.values():
            if self.count_bytes:
                self.bytes_up += reply.nbytes()
            self.samples += int(reply.metrics.get("samples", 0))
            self.seen_shares.update(share_key(k) for k in reply.arrays)
        self._enforce_policy(task, list(ids), replies)
        return replies

    def _fail(self, cid: int, task: str, problem: str) -> None:
        message = f"round {self.round}: client {cid} failed task {task!r}: {problem}"
        log.warning(message)
        self.failures.append(message)

    def _enforce_policy(self, task: str, ids: list[int], replies: dict[int, Record]) -> None:
        missing = len(ids) - len(replies)
        if not missing:
            return
        if self.failure_policy == "strict":
            raise RoundFailed(
                f"round {self.round}, task {task!r}: {missing} of {len(ids)} clients failed "
                "(failure_policy=strict)"
            )
        if self.failure_policy == "dynamic" and len(replies) < min(self.min_clients, len(ids)):
            raise RoundFailed(
                f"round {self.round}, task {task!r}: only {len(replies)} of {len(ids)} "
                f"clients replied, min_clients={self.min_clients}"
            )
