"""A ClientApp that tampers with its own replies: node-level fault injection for Flower.

``app`` behaves exactly like :data:`fedshift.engine.flower.clientapp.app` unless the
SuperNode's node config names a fault, e.g.
``--node-config "partition-id=2 num-partitions=3 fault='num-examples-negative'"``;
a comma-separated list injects one fault per round in turn, and ``fault-round=<r>``
limits a single fault to round ``r`` (identity faults apply to every identity reply).
Point a test App's ``clientapp`` component at
``fedshift.engine.flower.faults:app`` to check that a deployment's ServerApp survives a
hostile node: every fault in :data:`FAULTS` must end as a failed client (or a refused
node), never as a crash or a changed model. The tampered replies are real Flower
messages, serialized over the wire. A fault the simulation engine also injects has the same
name there (:mod:`fedshift.engine.fault_names`).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from flwr.app import Array, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fedshift.engine import fault_names as names
from fedshift.engine.flower.clientapp import handle
from fedshift.engine.flower.messages import IDENTIFY, IDENTITY, control_of

ARRAYS, METRICS, METRICS_OTHER = "arrays", "metrics", "metrics-other"


def _set_metric(content: RecordDict, key: str, value, *, other: bool = False) -> None:
    """Put metric ``key`` in the numeric or the other metrics record only."""
    for name in (METRICS, METRICS_OTHER):
        if key in content[name]:
            del content[name][key]
    content[METRICS_OTHER if other else METRICS][key] = value


def _drop_metric(content: RecordDict, key: str) -> None:
    for name in (METRICS, METRICS_OTHER):
        if key in content[name]:
            del content[name][key]


def _map_arrays(content: RecordDict, change: Callable[[np.ndarray], np.ndarray]) -> None:
    arrays = content[ARRAYS]
    for key in list(arrays.keys()):
        arrays[key] = Array(np.ascontiguousarray(change(arrays[key].numpy())))


def _drop_first_array(content: RecordDict) -> None:
    del content[ARRAYS][next(iter(content[ARRAYS].keys()))]


def _extra_array(content: RecordDict) -> None:
    content[ARRAYS]["model.injected.weight"] = Array(np.ones(3, dtype=np.float32))


def _wrong_shape(content: RecordDict) -> None:
    key = next(iter(content[ARRAYS].keys()))
    content[ARRAYS][key] = Array(np.zeros((1, 2, 3), dtype=np.float32))


def _arrays_as_config(content: RecordDict) -> None:
    arrays = content[ARRAYS]
    content[ARRAYS] = ConfigRecord({k: a.numpy().ravel().tolist() for k, a in arrays.items()})


def _no_arrays(content: RecordDict) -> None:
    del content[ARRAYS]


def _nan(values: np.ndarray) -> np.ndarray:
    return np.full_like(values, np.nan) if values.dtype.kind == "f" else values


#: a reply's faults: each changes the (real) reply content in place
REPLY_FAULTS: dict[str, Callable[[RecordDict], None]] = {
    "num-examples-missing": lambda c: _drop_metric(c, "num-examples"),
    "num-examples-negative": lambda c: _set_metric(c, "num-examples", -5),
    names.NUM_EXAMPLES_STRING: lambda c: _set_metric(c, "num-examples", "12", other=True),
    names.NUM_EXAMPLES_HUGE: lambda c: _set_metric(c, "num-examples", 1e308),
    "samples-string": lambda c: _set_metric(c, "samples", "x", other=True),
    names.KEY_MISSING: _drop_first_array,
    names.KEY_EXTRA: _extra_array,
    "no-arrays": _no_arrays,
    "arrays-as-config": _arrays_as_config,
    names.INT8: lambda c: _map_arrays(c, lambda a: np.zeros(a.shape, dtype=np.int8)),
    names.WRONG_SHAPE: _wrong_shape,
    names.NAN: lambda c: _map_arrays(c, _nan),
}

#: identity faults: the node's answer to "which client do you serve?"
IDENTITY_FAULTS: dict[str, dict] = {
    "partition-id-string": {"partition-id": "zero"},
    "partition-id-list": {"partition-id": [0, 1]},
}

FAULTS = (*REPLY_FAULTS, *IDENTITY_FAULTS)

app = ClientApp()


def fault_of(node_config, round_: int) -> str:
    """The fault this node injects in ``round_`` ("" for none).

    ``fault`` names one fault or a comma-separated list taken in turn, one per round
    (round 1 the first); ``fault-round=<r>`` limits a single fault to round ``r``.
    """
    names = [f.strip() for f in str(node_config.get("fault", "")).split(",") if f.strip()]
    unknown = [f for f in names if f not in FAULTS]
    if unknown:
        raise ValueError(names.unknown_fault(unknown[0], FAULTS))
    if not names:
        return ""
    only_round = int(node_config.get("fault-round", 0))
    if only_round and round_ != only_round:
        return ""
    return names[(max(round_, 1) - 1) % len(names)]


def tampered(message: Message, context: Context) -> Message:
    """The real ClientApp's reply, changed as the node config's ``fault`` says."""
    control = control_of(message.content)
    if control.get("task") == IDENTIFY:
        claimed = [f for f in IDENTITY_FAULTS if f in str(context.node_config.get("fault", ""))]
        if claimed:
            identity = {**dict(context.node_config), **IDENTITY_FAULTS[claimed[0]]}
            keys = ("partition-id", "num-partitions")
            record = ConfigRecord({k: v for k, v in identity.items() if k in keys})
            return Message(RecordDict({IDENTITY: record}), reply_to=message)
    reply = handle(message, context)
    fault = fault_of(context.node_config, int(control.get("round", 0)))
    if fault in REPLY_FAULTS and control.get("call", -1) != -1:
        if ARRAYS in reply.content and reply.content[ARRAYS]:
            REPLY_FAULTS[fault](reply.content)
    return reply


@app.train()
def train(message: Message, context: Context) -> Message:
    return tampered(message, context)


@app.query()
def query(message: Message, context: Context) -> Message:
    return tampered(message, context)
