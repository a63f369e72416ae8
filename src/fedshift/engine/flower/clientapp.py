"""The Flower ``ClientApp``: runs the algorithm's named client task for this SuperNode.

fedshift and torch are imported inside the handler, so the identity query (answered from
the node config) costs a bare ClientApp process only.

Every message rebuilds the federated task from the run config (the dataset is built
locally; Flower starts a new ClientApp process per message), picks this node's client
from its node config, restores ``ctx.state`` from Flower's ``Context.state``, runs the
task with the simulation engine's seeding and stores ``ctx.state`` back, in the context
and in a snapshot on the node's disk (:mod:`.node_state`) from which a resumed run
continues. The engine's evaluate task scores the client's personal model on the node.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import TYPE_CHECKING, Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedshift.engine.flower.messages import (
    CONTROL,
    EVALUATE,
    IDENTIFY,
    IDENTITY,
    REFUSED,
    identity_of,
)

if TYPE_CHECKING:  # torch-heavy: imported by the handler only
    from fedshift.engine.flower.node_state import NodeSnapshots

app = ClientApp()

#: ConfigRecord in ``Context.state`` naming the fedshift run whose client state it holds
RUN_MARK = "fedshift-run"


@functools.lru_cache(maxsize=2)
def _experiment(run_config_json: str, cache_dir: str):
    """The prepared experiment of a run config (cached for in-process use and tests)."""
    from fedshift.engine.assembly import prepare
    from fedshift.engine.flower.settings import load_run_dataset, parse_run_config

    cfg, opts = parse_run_config(json.loads(run_config_json))
    return prepare(cfg, dataset=load_run_dataset(cfg, opts, cache_dir))


def handle(message: Message, context: Context) -> Message:
    """Answer one message: the engine's identity query or an algorithm's client task."""
    control = dict(message.content[CONTROL]) if CONTROL in message.content else {}
    task = str(control.get("task", ""))
    if task == IDENTIFY:
        identity = ConfigRecord(identity_of(dict(context.node_config)))
        return Message(RecordDict({IDENTITY: identity}), reply_to=message)
    if task == REFUSED:
        reason = str(control.get("reason", ""))[:500]
        # the SuperNode's log: the ClientApp process writes to the SuperNode's stderr
        print(f"fedshift: the ServerApp refused this SuperNode: {reason}", file=sys.stderr)
        return Message(RecordDict(), reply_to=message)
    from fedshift.core.record import Record
    from fedshift.engine.evaluation import client_scores
    from fedshift.engine.federation import run_client_task
    from fedshift.engine.flower.convert import from_recorddict, save_state, to_recorddict
    from fedshift.engine.flower.node_state import NodeSnapshots, state_root
    from fedshift.engine.flower.settings import node_cache_dir, node_client_id

    node_config: dict[str, Any] = dict(context.node_config)
    exp = _experiment(
        json.dumps(dict(context.run_config), sort_keys=True), node_cache_dir(node_config)
    )
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
        return Message(to_recorddict(Record(metrics=dict(scores or {}))), reply_to=message)
    reply = run_client_task(
        exp.algorithm,
        ctx,
        task,
        from_recorddict(message.content, with_control=True),
        seed=exp.cfg.seed,
        round_=round_,
        call_index=int(control["call"]),
        total_rounds=exp.cfg.rounds,
    )
    save_state(ctx.state, context.state)
    context.state[RUN_MARK] = ConfigRecord({"token": str(control["token"])})
    snapshots.save(round_, ctx.state)
    return Message(to_recorddict(reply), reply_to=message)


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
