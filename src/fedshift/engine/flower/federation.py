"""FlowerFederation: ``fed.call`` as Message-API exchanges over a Flower ``Grid``."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedshift.core.errors import ConfigError
from fedshift.core.record import Record
from fedshift.engine.assembly import Experiment
from fedshift.engine.evaluation import DOMAIN_SCORE, ClientScores
from fedshift.engine.federation import BaseFederation, federation_options
from fedshift.engine.flower.client_keys import load_client_keys, public_key_der
from fedshift.engine.flower.convert import ConversionError, from_recorddict, to_recorddict
from fedshift.engine.flower.messages import (
    CONTROL,
    EVALUATE,
    IDENTIFY,
    IDENTITY,
    QUERY_MESSAGE_TYPE,
    REFUSED,
    TASK_MESSAGE_TYPE,
)
from fedshift.engine.flower.settings import DeployOptions, node_client_id

log = logging.getLogger(__name__)

#: seconds after which a node that has not answered its identity query is asked again
IDENTIFY_TIMEOUT = 60.0
#: first and longest pause (s) between pulls for replies
MIN_POLL, MAX_POLL = 0.05, 0.5


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
        if exp.cfg.attack:
            raise ConfigError(
                "attack is simulated by the in-process engine only; run it without Flower"
            )
        roles = {cid: ctx.role for cid, ctx in exp.contexts.items()}
        super().__init__(exp.algorithm, roles, **federation_options(exp))
        self.grid = grid
        self.run_token = run_token
        self.round_timeout = opts.round_timeout
        self.connect_timeout = opts.connect_timeout
        self.client_ids = [c.client_id for c in exp.scenario.clients]
        #: the node each client is bound to (``client-keys``); None: any node may claim one
        self.client_keys = (
            load_client_keys(opts.client_keys, self.client_ids) if opts.client_keys else None
        )
        self._node_keys: dict[int, bytes] = {}  # node id -> its registered key (DER)
        self.nodes: dict[int, int] = {}  # client id -> node id
        self._asked: set[int] = set()  # node ids that said who they are (or were refused)
        # identity queries not answered yet: message id -> (node id, when it was sent)
        self._identifying: dict[str, tuple[int, float]] = {}
        self._released: dict[int, int] = {}  # client id -> its node that went offline
        self._connected = False

    def _arrivals(
        self, messages: list[Message], timeout: float
    ) -> Iterator[list[tuple[int, Message]]]:
        """Push ``messages`` and yield the replies of each pull as they arrive, each with
        the position of the message it answers, until all came or ``timeout`` passed. The
        list is emptied once the messages are sent, so the sent copies can go.

        Flower 1.41's ``Grid.send_and_receive`` sleeps a fixed 3 s between pulls, which
        adds 1.5 s on average to every exchange, and hands every reply over at the end;
        this polls after 0.05 s, backing off to at most :data:`MAX_POLL` seconds, so a reply
        is seen, and can be folded in, soon after it arrives.
        """
        self.grid.push_messages(messages)
        position = {m.metadata.message_id: i for i, m in enumerate(messages)}
        messages.clear()
        yield from self._replies(position, timeout)

    def _replies(
        self, pending: dict[str, int], timeout: float
    ) -> Iterator[list[tuple[int, Message]]]:
        """Pull the replies to the sent messages ``pending`` (message id -> a tag) and yield
        those of each pull with their tags, until all came or ``timeout`` passed; an
        answered id leaves ``pending``."""
        deadline = time.monotonic() + timeout
        pause = MIN_POLL
        while pending:
            batch: list[tuple[int, Message]] = []
            for reply in self.grid.pull_messages(list(pending)):
                answered = reply.metadata.reply_to_message_id
                if answered in pending:
                    batch.append((pending.pop(answered), reply))
            if batch:
                yield batch
            left = deadline - time.monotonic()
            if not pending or left <= 0:
                break
            time.sleep(min(pause, left))
            pause = min(pause * 1.5, MAX_POLL)

    # -- client discovery ------------------------------------------------------------------
    def begin_round(self, round_: int) -> None:
        super().begin_round(round_)
        if not self._connected:
            self.wait_for_clients()
            self._connected = True
        else:
            self.discover()

    def wait_for_clients(self) -> None:
        """Identify SuperNodes until every client has one or ``connect_timeout`` passed.

        Each node is asked once and its answer awaited up to the connect deadline: on a
        busy machine a SuperNode needs seconds to start the ClientApp process that answers,
        and that start must not count against the round timeout.
        """
        deadline = time.monotonic() + self.connect_timeout
        while True:
            self.discover(wait=min(1.0, max(deadline - time.monotonic(), 0.0)))
            missing = [c for c in self.client_ids if c not in self.nodes]
            if not missing or time.monotonic() >= deadline:
                break
            if not self._identifying:
                time.sleep(1.0)  # nothing to wait for: let new SuperNodes come online
        if missing:
            log.warning("no SuperNode serves clients %s; they count as failed", missing)

    def discover(self, wait: float | None = None) -> None:
        """Forget nodes that went offline, ask new nodes which client they serve and take
        the answers that came within ``wait`` seconds (default: the round timeout, at most
        :data:`IDENTIFY_TIMEOUT`).

        A node is asked once; its answer is taken whenever it comes, in this discovery or
        a later one (it is asked again only after :data:`IDENTIFY_TIMEOUT` seconds without
        one). Before, each discovery asked again and waited for the new query only, so on a
        machine where a SuperNode needed longer than the round timeout to start the
        ClientApp that answers, every answer came too late for its query and no node was
        ever identified.

        A client is claimed once: while the node holding it is online, a second node naming
        the same client is refused (logged here, and told so in its own log), as is a node
        whose identity is not an integer id of this task; within one discovery the lower
        node id claims first. A refused node is never asked again in this run. When the
        holder goes offline (a restarted SuperNode gets a new node id), the next node
        naming that client takes it over, logged. With ``client-keys``, a node may claim
        only the client its registered key (or node id) is bound to. Nothing a node
        answers can raise here.
        """
        if self.client_keys is not None and self.client_keys.keys:
            online = self._online_with_keys()
        else:
            online = set(int(n) for n in self.grid.get_node_ids())
        gone = {c: n for c, n in self.nodes.items() if n not in online}
        self.nodes = {c: n for c, n in self.nodes.items() if n in online}
        self._released.update(gone)
        now = time.monotonic()
        self._identifying = {
            m: (node, sent) for m, (node, sent) in self._identifying.items() if node in online
        }
        waiting = {
            node for node, sent in self._identifying.values() if now - sent < IDENTIFY_TIMEOUT
        }
        new = sorted(online - self._asked - waiting)
        if not new and not self._identifying:
            return
        messages = [
            Message(
                RecordDict({CONTROL: ConfigRecord({"task": IDENTIFY})}),
                dst_node_id=node,
                message_type=QUERY_MESSAGE_TYPE,
                group_id=f"identify-{self.round}",
            )
            for node in new
        ]
        if messages:
            self.grid.push_messages(messages)
            self._identifying.update(
                {m.metadata.message_id: (m.metadata.dst_node_id, now) for m in messages}
            )
        if wait is None:
            wait = min(self.round_timeout, IDENTIFY_TIMEOUT)
        pending = {m: node for m, (node, _) in self._identifying.items()}
        replies = [reply for batch in self._replies(pending, wait) for _, reply in batch]
        self._identifying = {m: v for m, v in self._identifying.items() if m in pending}
        refused: dict[int, str] = {}
        for reply in sorted(replies, key=lambda r: int(r.metadata.src_node_id)):
            node = int(reply.metadata.src_node_id)
            if node not in online or node in self._asked:
                continue
            if reply.has_error():
                log.warning("node %s did not say which client it serves", node)
                continue
            self._asked.add(node)  # a node whose answer failed is asked again
            self._identifying = {m: v for m, v in self._identifying.items() if v[0] != node}
            try:
                cid = self._claim(node, reply.content)
            except ConfigError as exc:
                refused[node] = str(exc)
                log.warning("node %s refused: %s", node, exc)
                continue
            if cid in self._released:
                log.warning(
                    "client %s is now served by node %s (node %s went offline)",
                    cid,
                    node,
                    self._released.pop(cid),
                )
            else:
                log.info("client %s is served by node %s", cid, node)
        if refused:
            self._tell_refused(refused)

    def _online_with_keys(self) -> set[int]:
        """The online nodes, remembering each one's registered public key (Flower 1.41
        gives the ServerApp ``NodeInfo.public_key``, PEM, for a registered node)."""
        online = set()
        for info in self.grid.get_nodes():
            node = int(info.node_id)
            online.add(node)
            if node not in self._node_keys and getattr(info, "public_key", b""):
                try:
                    self._node_keys[node] = public_key_der(info.public_key, f"node {node}'s key")
                except ConfigError as exc:
                    log.warning("%s", exc)
        return online

    def _claim(self, node: int, content: RecordDict) -> int:
        """The client ``node`` may serve, or a :class:`ConfigError` saying why not."""
        identity = content[IDENTITY] if IDENTITY in content else None
        if not isinstance(identity, ConfigRecord):
            raise ConfigError("its reply holds no identity config record")
        cid = node_client_id(dict(identity), self.client_ids)
        if self.client_keys is not None:
            self.client_keys.check(cid, node, self._node_keys.get(node))
        holder = self.nodes.get(cid)
        if holder is not None and holder != node:
            raise ConfigError(
                f"client {cid} is already served by node {holder} in this run; "
                "a second claim is refused"
            )
        self.nodes[cid] = node
        return cid

    def _tell_refused(self, refused: dict[int, str]) -> None:
        """Send each refused node the reason, for its own log (no reply is awaited)."""
        messages = [
            Message(
                RecordDict({CONTROL: ConfigRecord({"task": REFUSED, "reason": reason})}),
                dst_node_id=node,
                message_type=QUERY_MESSAGE_TYPE,
                group_id=f"refused-{self.round}",
            )
            for node, reason in refused.items()
        ]
        self.grid.push_messages(messages)

    # -- one call -----------------------------------------------------------------------
    def _exchange(
        self, task: str, sends: dict[int, Record], call_index: int, **control
    ) -> tuple[dict[int, Record], dict[int, str]]:
        """Send ``sends`` to the clients' nodes; their readable replies and the problems."""
        received: dict[int, Record] = {}
        problems: dict[int, str] = {}
        for cid, reply in self._decoded(task, sends, call_index, problems, **control):
            received[cid] = reply
        return received, problems

    def _decoded(
        self,
        task: str,
        sends: dict[int, Record],
        call_index: int,
        problems: dict[int, str],
        **control,
    ) -> Iterator[tuple[int, Record]]:
        """Send ``sends`` to the clients' nodes and decode the replies in the order of
        ``sends``, each as soon as it and those before it are in (a reply that overtook an
        earlier one waits for it), each message let go of once decoded; ``problems`` gets
        the clients without a readable reply."""
        order: list[int] = []
        messages: list[Message] = []
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
                "timeout": self.round_timeout,
                **control,
            }
            message = Message(
                to_recorddict(sent, header),
                dst_node_id=node,
                message_type=TASK_MESSAGE_TYPE,
                group_id=str(self.round),
            )
            order.append(cid)
            messages.append(message)
        if not messages:
            return
        arrived: dict[int, Message] = {}
        head = 0
        for batch in self._arrivals(messages, self.round_timeout):
            for index, reply in batch:
                cid = order[index]
                if reply.has_error():
                    error = reply.error
                    problems[cid] = f"error reply (code {error.code}): {error.reason}"
                elif int(reply.metadata.src_node_id) != self.nodes.get(cid):
                    problems[cid] = f"reply came from node {reply.metadata.src_node_id}"
                else:
                    arrived[cid] = reply
            del batch
            while head < len(order) and (order[head] in arrived or order[head] in problems):
                found = self._decode(task, sends, order[head], arrived, problems)
                head += 1
                if found is not None:
                    yield found
        for cid in order[head:]:
            if cid not in arrived and cid not in problems:
                problems[cid] = f"no reply within {self.round_timeout:g} s"
            found = self._decode(task, sends, cid, arrived, problems)
            if found is not None:
                yield found

    def _decode(
        self,
        task: str,
        sends: dict[int, Record],
        cid: int,
        arrived: dict[int, Message],
        problems: dict[int, str],
    ) -> tuple[int, Record] | None:
        """Client ``cid``'s arrived reply decoded (and let go of), or None with its problem."""
        reply = arrived.pop(cid, None)
        if reply is None:
            return None
        try:
            schema = None if task == EVALUATE else self.algorithm.reply_schema(task, sends[cid])
            return cid, from_recorddict(reply.content, schema=schema)
        except ConversionError as exc:
            problems[cid] = f"unreadable reply: {exc}"
            return None

    def _dispatch(
        self, task: str, sends: dict[int, Record], call_index: int
    ) -> Iterator[tuple[int, Record]]:
        problems: dict[int, str] = {}
        reported = 0
        for cid, record in self._decoded(task, sends, call_index, problems):
            reported = self._report(task, problems, reported)
            yield cid, record
        self._report(task, problems, reported)

    def _report(self, task: str, problems: dict[int, str], reported: int) -> int:
        """Fail the clients of ``problems`` after the first ``reported`` (in the order
        found); how many are reported now."""
        for cid, problem in list(problems.items())[reported:]:
            self._fail(cid, task, problem)
        return len(problems)

    def score_clients(self, with_domains: bool) -> dict[int, ClientScores]:
        """Each client's personal model scored on its node.

        Evaluation is not training: it moves no arrays, counts no bytes and a client that
        cannot answer is left out of the means (logged), not counted as failed.
        """
        sends = {cid: Record() for cid in self.client_ids}
        received, problems = self._exchange(EVALUATE, sends, -1, domains=with_domains)
        for cid, problem in problems.items():
            log.warning("round %s: client %s was not evaluated: %s", self.round, cid, problem)
        needed = {"val", "test"}
        scores: dict[int, ClientScores] = {}
        for cid, reply in received.items():
            problem = score_problem(reply, needed, with_domains)
            if problem:
                log.warning("round %s: client %s was not evaluated: %s", self.round, cid, problem)
                continue
            scores[cid] = {k: float(v) for k, v in reply.metrics.items()}
        return scores


def score_problem(reply: Record, needed: set[str], with_domains: bool) -> str | None:
    """Why a node's evaluate reply cannot be used (scores are accuracies in [0, 1])."""
    if reply.arrays:
        return "an evaluate reply carries no arrays"
    for key, value in reply.metrics.items():
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        if not is_number or not 0.0 <= float(value) <= 1.0:
            return f"score {key!r} is {value!r}, not a number in [0, 1]"
    if not needed <= reply.metrics.keys():
        return f"scores {sorted(needed - reply.metrics.keys())} are missing"
    if with_domains and not any(DOMAIN_SCORE in k for k in reply.metrics):
        return "per-domain scores are missing"
    return None
