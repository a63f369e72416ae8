"""The federation base every engine shares: sampling, reply validation, the failure policy
and byte counting. Engines (:mod:`~fedshift.engine.simulation.dispatch`,
:mod:`~fedshift.engine.flower`) are sibling subclasses that only dispatch a call to their
clients and score personal models where the client states live.
"""

from __future__ import annotations

import contextlib
import logging
import math
from abc import abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from fedshift.core.algorithm import Algorithm
from fedshift.core.context import ClientContext
from fedshift.core.errors import ConfigError, RoundFailed
from fedshift.core.federation import Federation, ReplyFold
from fedshift.core.record import Kind, Record, share_key
from fedshift.core.schema import ReplySchema, lookup, schema_problem
from fedshift.core.seeding import derive_seed, numpy_generator, seed_torch
from fedshift.engine.assembly import Experiment
from fedshift.engine.evaluation import ClientScores

log = logging.getLogger(__name__)


#: kinds holding one row per sample (or per image): their leading dimension may differ
#: between clients, so the cross-reply comparison leaves it out
PER_SAMPLE_KINDS = (Kind.AMPLITUDE, Kind.FEATURES, Kind.LOGITS)
#: ``samples`` (processed, for throughput) may claim at most this many passes over the data
MAX_PASSES = 1000
#: the metrics that are sample counts, bounded by the client's data size instead of
#: ``max_reply_value``
COUNT_METRICS = ("num-examples", "samples")


def _number_problem(key: str, value: object) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"metric {key!r} is {type(value).__name__} {value!r}, not a number"
    if isinstance(value, float) and not math.isfinite(value):
        return f"metric {key!r} is {value}"
    return None


def _count_problem(key: str, value: object, low: int, high: int | None) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"metric {key!r} is {type(value).__name__} {value!r}, not an integer"
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        return f"metric {key!r} is {value}, outside {bound} for this client"
    return None


def validate_reply(
    reply: object,
    schema: ReplySchema,
    shares: Mapping[str, object],
    *,
    max_value: float = 0.0,
    data_size: int | None = None,
) -> str | None:
    """Why a client's reply must be refused, or None when it may reach the server program.

    Checked: the reply is a :class:`Record` of string keys, dense tensors and numbers; every
    array belongs to a declared share and follows the task's ``schema`` (keys, shapes,
    dtypes); floating arrays are finite and, with ``max_value`` > 0, within ±``max_value``;
    metrics are finite numbers, the ones that are not sample counts (a loss, an accuracy)
    also within ±``max_value`` (a loss of 1e308 is as hostile as such a weight);
    ``num-examples`` (the aggregation weight) is an integer in
    1..``data_size`` and is present whenever arrays are; ``samples`` an integer in
    0..``MAX_PASSES``·``data_size``.
    """
    if not isinstance(reply, Record):
        return f"reply is {type(reply).__name__}, not a Record"
    for name in ("arrays", "config", "metrics"):
        part = getattr(reply, name)
        if not isinstance(part, dict) or not all(isinstance(k, str) for k in part):
            return f"reply {name} is not a mapping of names"
    for key, value in reply.arrays.items():
        if not isinstance(value, torch.Tensor) or value.layout != torch.strided:
            return f"array {key!r} is {type(value).__name__}, not a dense tensor"
        if share_key(key) not in shares:
            return f"array {key!r} is not declared in shares ({', '.join(shares) or 'nothing'})"
    problem = schema_problem(reply.arrays, schema)
    if problem:
        return problem
    for key, value in reply.arrays.items():
        if value.is_floating_point() and value.numel():
            peak = float(value.detach().abs().max())
            if not math.isfinite(peak):
                return f"{key!r} holds NaN or Inf"
            if max_value > 0 and peak > max_value:
                return f"{key!r} holds {peak:.3g}, beyond max_reply_value={max_value:g}"
    for key, value in reply.metrics.items():
        problem = _number_problem(key, value)
        if problem:
            return problem
        if max_value > 0 and key not in COUNT_METRICS and abs(value) > max_value:
            return f"metric {key!r} is {value:.3g}, beyond max_reply_value={max_value:g}"
    if "num-examples" in reply.metrics:
        problem = _count_problem("num-examples", reply.metrics["num-examples"], 1, data_size)
        if problem:
            return problem
    elif reply.arrays or any(spec.required for spec in schema.values()):
        return "metric 'num-examples' is missing"
    if "samples" in reply.metrics:
        most = MAX_PASSES * data_size if data_size is not None else None
        problem = _count_problem("samples", reply.metrics["samples"], 0, most)
        if problem:
            return problem
    return None


def check_shapes(
    replies: dict[int, Record],
    shares: Mapping[str, object] | None = None,
    open_keys: Mapping[int, set[str]] | None = None,
) -> dict[int, str]:
    """Clients whose array shapes disagree with the most common shape in this call.

    Only the keys each schema leaves open are compared (``open_keys``: client -> keys;
    None: every key). Arrays of a per-sample kind (in ``shares``) are compared without
    their leading dimension. With a tie the shape seen first (lowest client id) wins.
    """
    per_sample = {k for k, kind in (shares or {}).items() if kind in PER_SAMPLE_KINDS}
    shapes: dict[str, dict[tuple, list[int]]] = {}
    for cid, reply in sorted(replies.items()):
        for key, value in reply.arrays.items():
            if open_keys is not None and key not in open_keys.get(cid, ()):
                continue
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


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def client_data_size(ctx: ClientContext) -> int:
    """The most samples a client can honestly claim to have used: its largest split."""
    return max(len(view) for view in (ctx.train, ctx.val, ctx.test) if view is not None)


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
    """The run config's settings of a federation (every engine's): the run keys of section
    ``federation`` (fraction, failure_policy, min_clients, max_reply_value) and what the run
    says besides."""
    cfg = exp.cfg
    return {
        **cfg.section("federation"),
        "seed": cfg.seed,
        "count_bytes": not exp.algorithm.pooled,
        "total_rounds": cfg.rounds,
        "data_sizes": {cid: client_data_size(ctx) for cid, ctx in exp.contexts.items()},
    }


class BaseFederation(Federation):
    """What every engine shares; subclasses implement :meth:`_dispatch` and
    :meth:`score_clients`.

    Sampling is seeded per (round, call); every reply is validated in one place for both
    engines (:func:`validate_reply`: declared shares, the task's reply schema, finite and
    bounded values, the metrics and the sample count the aggregation weight rests on; open
    dimensions agreeing across the call); a refused reply is a failed client with a
    one-line reason, never an error in the server; bytes up and down are counted; the
    failure policy is ``strict`` (every called client must succeed), ``dynamic`` (at least
    ``min_clients``, or every client of a smaller call) or ``resilient`` (go on with
    whoever replied); a call in which nobody replied fails the round under every policy, as
    there is nothing to go on with. ``data_sizes`` (client -> its largest split, as the
    server knows it) bounds ``num-examples``.
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
        max_reply_value: float = 0.0,
        data_sizes: Mapping[int, int] | None = None,
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
        self.max_reply_value = max_reply_value
        self.data_sizes = dict(data_sizes or {})
        sampled = max(1, round(fraction * len(self.clients("source"))))
        if failure_policy == "dynamic" and min_clients > sampled:
            raise ConfigError(
                f"min_clients={min_clients} but only {sampled} source clients take part in a "
                "round; lower min_clients or raise fraction"
            )
        self.round = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.samples = 0
        self.failures: list[str] = []
        self.failed_ids: list[int] = []
        self.seen_shares: set[str] = set()
        #: called with the ids of every call before it is dispatched (the runner keeps what
        #: it needs to undo a failed round there); None: nothing to call
        self.on_dispatch: Callable[[list[int]], None] | None = None
        self._calls = 0

    # -- what engines implement -----------------------------------------------------------
    @abstractmethod
    def _dispatch(
        self, task: str, sends: dict[int, Record], call_index: int
    ) -> Iterable[tuple[int, Record]]:
        """Run client task ``task`` on every client of ``sends``: ``(client, reply)`` of the
        clients that replied, in the order of ``sends``, each as soon as it is at hand (a
        client left out has failed and was reported with :meth:`_fail`)."""

    @abstractmethod
    def score_clients(self, with_domains: bool) -> dict[int, ClientScores]:
        """Each client's personal model scored where its state lives (clients without
        one are left out): ``val``, ``test`` and, ``with_domains``, ``domain.<name>``."""

    # -- shared ----------------------------------------------------------------------------
    def begin_round(self, round_: int) -> None:
        self.round = round_
        self._calls = 0
        self.failures = []
        self.failed_ids = []

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
        self,
        task: str,
        ids: Sequence[int],
        record: Record | Mapping[int, Record],
        fold: ReplyFold | None = None,
    ) -> dict[int, Record]:
        call_index = self._calls
        self._calls += 1
        sends = {cid: record[cid] if isinstance(record, Mapping) else record for cid in ids}
        if self.count_bytes:
            self.bytes_down += sum(sent.nbytes() for sent in sends.values())
        if self.on_dispatch is not None:
            self.on_dispatch(list(sends))
        replies: dict[int, Record] = {}
        open_keys: dict[int, set[str]] = {}
        schemas: dict[int, ReplySchema] = {}
        #: kept replies a later check may still refuse (their open shapes are compared
        #: across the call), and every reply after the first of them: settled in order
        unsettled: list[int] = []
        for cid, reply in self._dispatch(task, sends, call_index):
            sent = sends[cid]
            schema = schemas.get(id(sent))
            if schema is None:
                schema = schemas[id(sent)] = self.algorithm.reply_schema(task, sent)
            problem = validate_reply(
                reply,
                schema,
                self.algorithm.shares,
                max_value=self.max_reply_value,
                data_size=self.data_sizes.get(cid),
            )
            if problem:
                self._fail(cid, task, problem)
                continue
            reply.arrays = {k: v.detach().to("cpu") for k, v in reply.arrays.items()}
            replies[cid] = reply
            open_keys[cid] = {k for k in reply.arrays if lookup(schema, k).open}
            if unsettled or (self.shared_shapes and open_keys[cid]):
                unsettled.append(cid)
            else:
                self._settle(reply, fold, cid)
        if self.shared_shapes and unsettled:
            for cid, problem in check_shapes(replies, self.algorithm.shares, open_keys).items():
                self._fail(cid, task, problem)
                del replies[cid]
        for cid in unsettled:
            if cid in replies:
                self._settle(replies[cid], fold, cid)
        self._enforce_policy(task, list(ids), replies)
        return replies

    def _settle(self, reply: Record, fold: ReplyFold | None, cid: int) -> None:
        """Count a kept reply and hand it to the server program's ``fold``."""
        if self.count_bytes:
            self.bytes_up += reply.nbytes()
        self.samples += int(reply.metrics.get("samples", 0))
        self.seen_shares.update(share_key(k) for k in reply.arrays)
        if fold is not None:
            fold(cid, reply)

    def _fail(self, cid: int, task: str, problem: str) -> None:
        problem = " ".join(str(problem).split())
        message = f"round {self.round}: client {cid} failed task {task!r}: {problem}"
        log.warning(message)
        self.failures.append(message)
        self.failed_ids.append(cid)

    def _enforce_policy(self, task: str, ids: list[int], replies: dict[int, Record]) -> None:
        missing = len(ids) - len(replies)
        if not missing:
            return
        failed = ", ".join(str(cid) for cid in ids if cid not in replies)
        if not replies:
            raise RoundFailed(
                f"round {self.round}, task {task!r}: none of {len(ids)} clients replied "
                f"(failed: {failed}; failure_policy={self.failure_policy})"
            )
        if self.failure_policy == "strict":
            raise RoundFailed(
                f"round {self.round}, task {task!r}: {missing} of {len(ids)} clients failed "
                f"(clients {failed}; failure_policy=strict)"
            )
        if self.failure_policy == "dynamic" and len(replies) < min(self.min_clients, len(ids)):
            raise RoundFailed(
                f"round {self.round}, task {task!r}: only {len(replies)} of {len(ids)} "
                f"clients replied (failed: {failed}), min_clients={self.min_clients}"
            )
