"""The Flower ``ClientApp``: runs the algorithm's named client task for this SuperNode.

fedshift and torch are imported inside the handler, so the identity query (answered from
the node config) costs a bare ClientApp process only.

Every message rebuilds the federated task from the run config (the dataset is built
locally; Flower starts a new ClientApp process per message), picks this node's client
from its node config, restores ``ctx.state`` from Flower's ``Context.state``, runs the
task with the simulation engine's seeding and stores ``ctx.state`` back.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedshift.engine.flower.messages import CONTROL, IDENTIFY, IDENTITY, identity_of

app = ClientApp()


@functools.lru_cache(maxsize=2)
def _experiment(run_config_json: str, cache_dir: str):
    """The prepared experiment of a run config (cached for in-process use and tests)."""
    from fedshift.engine.flower.settings import load_run_dataset, parse_run_config
    from fedshift.engine.runner import prepare

    cfg, opts = parse_run_config(json.loads(run_config_json))
    return prepare(cfg, dataset=load_run_dataset(cfg, opts, cache_dir))


def handle(message: Message, context: Context) -> Message:
    """Answer one message: the engine's identity query or an algorithm's client task."""
    control = dict(message.content[CONTROL]) if CONTROL in message.content else {}
    task = str(control.get("task", ""))
    if task == IDENTIFY:
        identity = ConfigRecord(identity_of(dict(context.node_config)))
        return Message(RecordDict({IDENTITY: identity}), reply_to=message)
    from fedshift.engine.flower.convert import (
        from_recorddict,
        load_state,
        save_state,
        to_recorddict,
    )
    from fedshift.engine.flower.settings import node_cache_dir, node_client_id
    from fedshift.engine.simulation import run_client_task

    node_config: dict[str, Any] = dict(context.node_config)
    exp = _experiment(
        json.dumps(dict(context.run_config), sort_keys=True), node_cache_dir(node_config)
    )
    cid = node_client_id(node_config, [c.client_id for c in exp.task.clients])
    if int(control["client"]) != cid:
        raise RuntimeError(
            f"message for client {control['client']} reached the node serving client {cid}"
        )
    ctx = exp.contexts[cid]
    ctx.state = load_state(context.state)
    reply = run_client_task(
        exp.algorithm,
        ctx,
        task,
        from_recorddict(message.content),
        seed=exp.cfg.seed,
        round_=int(control["round"]),
        call_index=int(control["call"]),
        total_rounds=exp.cfg.rounds,
    )
    save_state(ctx.state, context.state)
    return Message(to_recorddict(reply), reply_to=message)


@app.train()
def train(message: Message, context: Context) -> Message:
    return handle(message, context)


@app.query()
def query(message: Message, context: Context) -> Message:
    return handle(message, context)
