"""FlowerFederation: ``fed.call`` as Message-API exchanges over a Flower ``Grid``."""

from __future__ import annotations

import logging
import time

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedshift.core.errors import ConfigError
from fedshift.core.record import Record
from fedshift.engine.assembly import Experiment
from fedshift.engine.evaluation import DOMAIN_SCORE, ClientScores
from fedshift.engine.federation import BaseFederation, federation_options
from fedshift.engine.flower.convert import ConversionError, from_recorddict, to_recorddict
from fedshift.engine.flower.messages import (
    CONTROL,
    EVALUATE,
    IDENTIFY,
    IDENTITY,
    QUERY_MESSAGE_TYPE,
    TASK_MESSAGE_TYPE,
)
from fedshift.engine.flower.settings import DeployOptions, node_client_id

log = logging.getLogger(__name__)

#: seconds to wait for identity replies (a node that does not answer is asked again later)
IDENTIFY_TIMEOUT = 60.0


class FlowerFederation(BaseFederation):
    """The server program's :class:`Federation` inside a Flower ``ServerApp``.

    Client ids map to SuperNodes through an identity query (each node answers with its
    ``--node-config``); the mapping is refreshed every round, so a restarted SuperNode
    (new node id) serves its client again from the next round on. ``call`` sends one
    ``Message`` per client and waits at most ``round_timeout`` seconds: a client without
    a node, with an error reply (e.g. its node died) or without a reply in time is a
    failed client. Sampling, seeding, reply validation against ``shares``, byte counting
    and the failure policy are the federation base's, shared with the simulation engine,
    so both engines give the same numbers for the same seed. ``run_token`` names the run
    on the SuperNodes (their client state snapshots); a resumed run keeps it. Personal
    models are scored on their nodes (:meth:`score_clients`).
    """

    def __init__(self, grid: Grid, exp: Experiment, opts: DeployOptions, run_token: str):
        roles = {cid: ctx.role for cid, ctx in exp.contexts.items()}
        super().__init__(exp.algorithm, roles, **federation_options(exp))
        self.grid = grid
        self.run_token = run_token
        self.round_timeout = opts.round_timeout
        self.connect_timeout = opts.connect_timeout
        self.client_ids = [c.client_id for c in exp.scenario.clients]
        self.nodes: dict[int, int] = {}  # client id -> node id
        self._asked: set[int] = set()  # node ids that said who they are
        self._connected = False

    # -- client discovery ------------------------------------------------------------------
    def begin_round(self, round_: int) -> None:
        super().begin_round(round_)
        if not self._connected:
            self.wait_for_clients()
            self._connected = True
        else:
            self.discover()

    def wait_for_clients(self) -> None:
        """Identify SuperNodes until every client has one or ``connect_timeout`` passed."""
        deadline = time.monotonic() + self.connect_timeout
        while True:
            self.discover()
            missing = [c for c in self.client_ids if c not in self.nodes]
            if not missing or time.monotonic() >= deadline:
                break
            time.sleep(1.0)
        if missing:
            log.warning("no SuperNode serves clients %s; they count as failed", missing)

    def discover(self) -> None:
        """Forget nodes that went offline and ask new nodes which client they serve."""
        online = set(int(n) for n in self.grid.get_node_ids())
        self.nodes = {c: n for c, n in self.nodes.items() if n in online}
        new = sorted(online - self._asked)
        if not new:
            return
        answered: set[int] = set()
        messages = [
            Message(
                RecordDict({CONTROL: ConfigRecord({"task": IDENTIFY})}),
                dst_node_id=node,
                message_type=QUERY_MESSAGE_TYPE,
                group_id=f"identify-{self.round}",
            )
            for node in new
        ]
        timeout = min(self.round_timeout, IDENTIFY_TIMEOUT)
        for reply in self.grid.send_and_receive(messages, timeout=timeout):
            node = int(reply.metadata.src_node_id)
            if reply.has_error() or IDENTITY not in reply.content:
                log.warning("node %s did not say which client it serves", node)
                continue
            answered.add(node)
            try:
                cid = node_client_id(dict(reply.content[IDENTITY]), self.client_ids)
            except ConfigError as exc:
                log.warning("node %s: %s", node, exc)
                continue
            self.nodes[cid] = node
            log.info("client %s is served by node %s", cid, node)
        self._asked.update(answered)  # nodes that did not answer are asked again

    # -- one call -----------------------------------------------------------------------
    def _exchange(
        self, task: str, sends: dict[int, Record], call_index: int, **control
    ) -> tuple[dict[int, Record], dict[int, str]]:
        """Send ``sends`` to the clients' nodes; their readable replies and the problems."""
        problems: dict[int, str] = {}
        messages: list[tuple[int, Message]] = []
        for cid, sent in sends.items():
            node = self.nodes.get(cid)
            if node is None:
                problems[cid] = "no SuperNode serves this client"
                continue
            header = {
                "task": task,
                "client": cid,
                "round": self.round,
                "call": call_index,
                "token": self.run_token,
                **control,
            }
            message = Message(
                to_recorddict(sent, header),
                dst_node_id=node,
                message_type=TASK_MESSAGE_TYPE,
                group_id=str(self.round),
            )
            messages.append((cid, message))
        if not messages:
            return {}, problems
        replies = self.grid.send_and_receive([m for _, m in messages], timeout=self.round_timeout)
        by_message = {m.metadata.message_id: cid for cid, m in messages}
        received: dict[int, Record] = {}
        for reply in replies:
            cid = by_message.get(reply.metadata.reply_to_message_id)
            if cid is None:
                continue
            if reply.has_error():
                error = reply.error
                problems[cid] = f"error reply (code {error.code}): {error.reason}"
                continue
            try:
                received[cid] = from_recorddict(reply.content)
            except (ConversionError, KeyError, TypeError, ValueError) as exc:
                problems[cid] = f"unreadable reply: {exc}"
        for cid, _ in messages:
            if cid not in received and cid not in problems:
                problems[cid] = f"no reply within {self.round_timeout:g} s"
        return received, problems

    def _dispatch(self, task: str, sends: dict[int, Record], call_index: int) -> dict[int, Record]:
        received, problems = self._exchange(task, sends, call_index)
        for cid, problem in problems.items():
            self._fail(cid, task, problem)
        return received

    def score_clients(self, with_domains: bool) -> dict[int, ClientScores]:
        """Each client's personal model scored on its node.

        Evaluation is not training: it moves no arrays, counts no bytes and a client that
        cannot answer is left out of the means (logged), not counted as failed.
        """
        sends = {cid: Record() for cid in self.client_ids}
        received, problems = self._exchange(EVALUATE, sends, -1, domains=with_domains)
        for cid, problem in problems.items():
            log.warning("round %s: client %s was not evaluated: %s", self.round, cid, problem)
        scores = {cid: {k: float(v) for k, v in r.metrics.items()} for cid, r in received.items()}
        needed = {"val", "test"}
        return {
            cid: s
            for cid, s in scores.items()
            if needed <= s.keys() and (not with_domains or any(DOMAIN_SCORE in k for k in s))
        }
