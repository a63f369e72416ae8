"""The Flower ``ClientApp``: runs the algorithm's named client task for this SuperNode.

fedshift and torch are imported inside the handler, so the identity query (answered from
the node config) costs a bare ClientApp process only.

Every message rebuilds the federated task from the run config (Flower 1.41 starts a new
ClientApp process per message; the dataset is opened from the node's memory-mapped cache,
:mod:`.node_cache`, built by the first message), picks this node's client
from its node config, restores ``ctx.state`` from Flower's ``Context.state``, runs the
task with the simulation engine's seeding and stores ``ctx.state`` back, in the context
and in a snapshot on the node's disk (:mod:`.node_state`) from which a resumed run
continues. The engine's evaluate task scores the client's personal model on the node.

With the node config's ``resident-worker`` on (the default below a SuperNode), this
process stays thin: it forwards the task to the node's long-running worker
(:mod:`.resident`), which keeps torch, the dataset and the experiment loaded and runs
:func:`answer`, the same code; it runs the task here only when the worker cannot be used
(logged).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedshift.engine.flower.messages import (
    EVALUATE,
    IDENTIFY,
    IDENTITY,
    REFUSED,
    control_of,
    identity_of,
)
from fedshift.engine.flower.transport import resident
from fedshift.engine.flower.transport.wire import finite_or_none

if TYPE_CHECKING:  # torch-heavy: imported by the handler only
    from fedshift.engine.flower.transport.node_state import NodeSnapshots

app = ClientApp()

#: ConfigRecord in ``Context.state`` naming the fedshift run whose client state it holds
RUN_MARK = "fedshift-run"


@functools.lru_cache(maxsize=2)
def _experiment(run_config_json: str, cache_dir: str):
    """The prepared experiment of a run config, its dataset from the node cache."""
    from fedshift.data.digits import default_cache_dir
    from fedshift.engine.assembly import prepare
    from fedshift.engine.flower.settings import load_run_dataset, parse_run_config
    from fedshift.engine.flower.transport.node_cache import node_dataset

    cfg, opts = parse_run_config(json.loads(run_config_json))
    root = Path(cache_dir or opts.cache_dir or default_cache_dir())
    dataset = node_dataset(
        cfg, opts.max_samples, root, lambda: load_run_dataset(cfg, opts, cache_dir)
    )
    return prepare(cfg, dataset=dataset)


def handle(message: Message, context: Context) -> Message:
    """Answer one message: the engine's identity query or an algorithm's client task."""
    control = control_of(message.content)
    task = str(control.get("task", ""))
    if task == IDENTIFY:
        identity = ConfigRecord(identity_of(dict(context.node_config)))
        return Message(RecordDict({IDENTITY: identity}), reply_to=message)
    if task == REFUSED:
        reason = str(control.get("reason", ""))[:500]
        # the SuperNode's log: the ClientApp process writes to the SuperNode's stderr
        print(f"fedshift: the ServerApp refused this SuperNode: {reason}", file=sys.stderr)
        return Message(RecordDict(), reply_to=message)
    limit = finite_or_none(control.get("timeout")) or 0.0
    if resident.supernode_pid() == os.getpid():
        limit = 0.0  # called inside a long-lived process (an in-process grid): never end it
    with give_up_after(limit):
        content = None
        if resident.enabled(context.node_config):
            content = resident.forward(message.content, context)
        if content is None:
            content = answer(message.content, context)
        return Message(content, reply_to=message)


def experiment_of(context: Context):
    """The prepared experiment of the context's run (cached per process)."""
    from fedshift.engine.flower.settings import node_cache_dir

    return _experiment(
        json.dumps(dict(context.run_config), sort_keys=True),
        node_cache_dir(dict(context.node_config)),
    )


def answer(content: RecordDict, context: Context) -> RecordDict:
    """Run the engine's evaluate task or an algorithm's client task on this node: the
    reply content; ``context.state`` holds the client's new state. The ClientApp process
    and the resident worker both answer through here."""
    from fedshift.core.record import Record
    from fedshift.engine.evaluation import client_scores
    from fedshift.engine.federation import run_client_task
    from fedshift.engine.flower.convert import from_recorddict, save_state, to_recorddict
    from fedshift.engine.flower.settings import node_client_id
    from fedshift.engine.flower.transport.node_state import NodeSnapshots, state_root

    control = control_of(content)
    task = str(control.get("task", ""))
    node_config: dict[str, Any] = dict(context.node_config)
    exp = experiment_of(context)
    cid = node_client_id(node_config, [c.client_id for c in exp.scenario.clients])
    if int(control["client"]) != cid:
        raise RuntimeError(
            f"message for client {control['client']} reached the node serving client {cid}"
        )
    ctx = exp.contexts[cid]
    round_ = int(control["round"])
    snapshots = NodeSnapshots(state_root(node_config), str(control["token"]), cid)
    ctx.state = restore_state(context.state, str(control["token"]), snapshots, round_)
    if task == EVALUATE:
        scores = client_scores(exp, ctx, bool(control.get("domains", False)))
        return to_recorddict(Record(metrics=dict(scores or {})))
    reply = run_client_task(
        exp.algorithm,
        ctx,
        task,
        from_recorddict(content, with_control=True),
        seed=exp.cfg.seed,
        round_=round_,
        call_index=int(control["call"]),
        total_rounds=exp.cfg.rounds,
    )
    save_state(ctx.state, context.state)
    context.state[RUN_MARK] = ConfigRecord({"token": str(control["token"])})
    snapshots.save(round_, ctx.state)
    return to_recorddict(reply)


#: seconds a task may run beyond the server's round timeout before its process gives up
GRACE = 5.0


@contextlib.contextmanager
def give_up_after(timeout: float) -> Iterator[None]:
    """Within this block, end the ClientApp process once the server can no longer use
    its reply (only a per-message ClientApp process: :func:`handle` passes 0, no watchdog,
    where the ClientApp is called inside a long-lived process, whose SIGINT would stop it
    all; before, an in-process test grid on a busy machine interrupted pytest itself).

    Flower 1.41 does not stop a running ClientApp when its run is stopped or failed (the
    SuperNode drops the late reply with "Run ... is not in RUNNING status"), so a long
    task would keep a core busy for nothing. The server waits ``timeout`` seconds per
    call; after that plus :data:`GRACE` this raises SIGINT, the signal Flower's own task
    heartbeat uses to stop a ClientApp, whose handler reports the task as stopped. The
    watchdog ends with the block, so a task that finishes in time is never touched.
    """
    if timeout <= 0:
        yield
        return

    def stop() -> None:
        print(
            f"fedshift: the task ran {timeout + GRACE:g} s, past the server's round timeout; "
            "stopping this ClientApp",
            file=sys.stderr,
            flush=True,
        )
        signal.raise_signal(signal.SIGINT)

    timer = threading.Timer(timeout + GRACE, stop)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def restore_state(
    flower_state: RecordDict, run_token: str, snapshots: NodeSnapshots, round_: int
) -> dict[str, Any]:
    """The client state: Flower's context within a run, the node's snapshot after a resume."""
    from fedshift.engine.flower.convert import load_state

    mark = flower_state[RUN_MARK] if RUN_MARK in flower_state else None
    if mark is not None and str(mark["token"]) == run_token:
        return load_state(flower_state)
    return snapshots.latest_before(round_)


@app.train()
def train(message: Message, context: Context) -> Message:
    return handle(message, context)


@app.query()
def query(message: Message, context: Context) -> Message:
    return handle(message, context)
