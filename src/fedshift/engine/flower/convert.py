"""Records and client state <-> Flower ``RecordDict``, without pickle.

A :class:`Record` becomes a ``RecordDict`` of an ``ArrayRecord`` (tensors as numpy
arrays, serialized by Flower with ``np.save(allow_pickle=False)``), a ``ConfigRecord`` for
``config``, a ``MetricRecord`` for numeric ``metrics`` and a ``ConfigRecord`` for the
non-numeric ones (strings, bools), so every value comes back with its type.

A client's ``ctx.state`` (nested dicts/lists/tuples of tensors and scalars) is stored in
Flower's ``Context.state`` as an ``ArrayRecord`` of its tensors plus a JSON description
of the tree in a ``ConfigRecord``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fedshift.core.bounded import parse_json
from fedshift.core.record import Record
from fedshift.core.schema import ReplySchema, schema_problem
from fedshift.engine.flower.messages import CONTROL
from fedshift.engine.flower.transport.wire import NUMPY, ProtocolError, npy_layout

ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
METRICS_OTHER = "metrics-other"
STATE_ARRAYS = "fedshift.state.arrays"
STATE_TREE = "fedshift.state.tree"


class ConversionError(ValueError):
    """A value that cannot cross the Flower boundary without pickle."""


def tensor_to_array(key: str, tensor: torch.Tensor) -> Array:
    """A CPU numpy copy of ``tensor`` as a Flower ``Array`` (dtype and shape kept)."""
    if not isinstance(tensor, torch.Tensor):
        raise ConversionError(f"{key!r} is {type(tensor).__name__}, not a tensor")
    if tensor.dtype == torch.bfloat16:
        raise ConversionError(f"{key!r} is bfloat16, which numpy cannot carry; cast it first")
    return Array(tensor.detach().to("cpu").contiguous().numpy())


def announced_layout(array: Array) -> tuple[np.dtype, tuple[int, ...]]:
    """The dtype and shape of a Flower ``Array``, from its ``.npy`` header alone: checked
    against the array's own dtype and shape fields and against the bytes that follow the
    header (:func:`~fedshift.engine.flower.transport.wire.npy_layout`), before anything is
    allocated.
    :class:`ConversionError` when they disagree or the header is not a plain array's."""
    if not isinstance(array, Array) or array.stype != NUMPY:
        raise ConversionError(f"is a {getattr(array, 'stype', type(array).__name__)!r} array")
    try:
        dtype, shape, _ = npy_layout(array.data)
    except ProtocolError as exc:
        raise ConversionError(str(exc)) from None
    if str(dtype) != array.dtype or list(shape) != list(array.shape):
        raise ConversionError(
            f"its .npy bytes hold {dtype}{list(shape)}, "
            f"the array says {array.dtype}{list(array.shape)}"
        )
    return dtype, shape


def array_to_tensor(array: Array) -> torch.Tensor:
    """A writable tensor owning a copy of the array's data; the header is checked first
    (:func:`announced_layout`), so no more than the bytes at hand is ever allocated."""
    announced_layout(array)
    try:
        return torch.from_numpy(np.array(array.numpy(), copy=True))
    except (TypeError, ValueError) as exc:  # a dtype torch cannot hold
        raise ConversionError(str(exc)) from None


def _meta_tensor(dtype: np.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor of ``dtype`` and ``shape`` that holds no data (for checks before loading)."""
    torch_dtype = torch.from_numpy(np.empty(0, dtype=dtype)).dtype
    return torch.empty(shape, dtype=torch_dtype, device="meta")


def arrays_to_record(tensors: Mapping[str, torch.Tensor]) -> ArrayRecord:
    record = ArrayRecord()
    for key, tensor in tensors.items():
        record[key] = tensor_to_array(key, tensor)
    return record


def _is_metric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def to_recorddict(record: Record, control: Mapping[str, Any] | None = None) -> RecordDict:
    """``record`` (plus optional engine ``control`` values) as a ``RecordDict``."""
    content = RecordDict()
    content[ARRAYS] = arrays_to_record(record.arrays)
    content[CONFIG] = ConfigRecord(dict(record.config))
    content[METRICS] = MetricRecord({k: v for k, v in record.metrics.items() if _is_metric(v)})
    content[METRICS_OTHER] = ConfigRecord(
        {k: v for k, v in record.metrics.items() if not _is_metric(v)}
    )
    if control is not None:
        content[CONTROL] = ConfigRecord(dict(control))
    return content


#: the records of a reply and the type each must have (a reply holds exactly these)
REPLY_RECORDS = {
    ARRAYS: ArrayRecord,
    CONFIG: ConfigRecord,
    METRICS: MetricRecord,
    METRICS_OTHER: ConfigRecord,
}


def from_recorddict(
    content: RecordDict, *, with_control: bool = False, schema: ReplySchema | None = None
) -> Record:
    """The :class:`Record` inside ``content`` (metrics in their original key order).

    ``content`` must hold exactly the records :func:`to_recorddict` writes, each of its
    type; anything else (a missing or extra record, arrays sent as a config record, an
    array numpy or torch cannot read, a metric under two names) is a
    :class:`ConversionError` naming the problem (``with_control``: the engine's
    instructions may ride along, as in the messages a ClientApp receives). Every array's
    ``.npy`` header is read and checked before any array is loaded; with ``schema`` (the
    task's reply schema) the keys, dtypes and shapes the headers announce must follow it,
    also before anything is loaded, so a reply announcing a huge array costs nothing.
    Values are checked against what was sent by the federation base, for every engine
    alike.
    """
    if not isinstance(content, RecordDict):
        raise ConversionError(f"content is {type(content).__name__}, not a RecordDict")
    names = set(content.keys()) - ({CONTROL} if with_control else set())
    if names != set(REPLY_RECORDS):
        missing, extra = set(REPLY_RECORDS) - names, names - set(REPLY_RECORDS)
        raise ConversionError(
            "records "
            + "; ".join(
                part
                for part in (
                    f"missing {sorted(missing)}" if missing else "",
                    f"unexpected {sorted(extra)}" if extra else "",
                )
                if part
            )
        )
    for name, kind in REPLY_RECORDS.items():
        if not isinstance(content[name], kind):
            raise ConversionError(
                f"record {name!r} is a {type(content[name]).__name__}, expected {kind.__name__}"
            )
    metrics = dict(content[METRICS])
    other = dict(content[METRICS_OTHER])
    both = sorted(set(metrics) & set(other))
    if both:
        raise ConversionError(f"metrics {both} appear twice")
    metrics.update(other)
    announced = {}
    for key, array in content[ARRAYS].items():
        try:
            announced[key] = _meta_tensor(*announced_layout(array))
        except (TypeError, ValueError, RuntimeError) as exc:  # ConversionError is a ValueError
            raise ConversionError(f"array {key!r} cannot be read: {exc}") from None
    if schema is not None:
        problem = schema_problem(announced, schema)
        if problem:
            raise ConversionError(f"announced arrays break the reply schema: {problem}")
    arrays = {}
    for key, array in content[ARRAYS].items():
        try:
            arrays[key] = array_to_tensor(array)
        except (TypeError, ValueError) as exc:
            raise ConversionError(f"array {key!r} cannot be read: {exc}") from None
    return Record(arrays=arrays, config=dict(content[CONFIG]), metrics=metrics)


# -- client state: a tree of tensors and scalars --------------------------------------------


def _encode(value: Any, path: str, arrays: ArrayRecord) -> Any:
    if isinstance(value, torch.Tensor):
        arrays[path] = tensor_to_array(path, value)
        return {"tensor": path}
    if isinstance(value, dict):
        items = []
        for i, (key, item) in enumerate(value.items()):
            if not isinstance(key, str | int) or isinstance(key, bool):
                raise ConversionError(f"state key {key!r} at {path!r} is not a str or int")
            items.append([key, _encode(item, f"{path}/{i}", arrays)])
        return {"dict": items}
    if isinstance(value, list | tuple):
        kind = "list" if isinstance(value, list) else "tuple"
        return {kind: [_encode(item, f"{path}/{i}", arrays) for i, item in enumerate(value)]}
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    if value is None or isinstance(value, bool | int | float | str):
        return {"value": value}
    raise ConversionError(f"state value at {path!r} has unsupported type {type(value).__name__}")


def _decode(node: Any, arrays: ArrayRecord) -> Any:
    """The value of one stored state node; a malformed tree is a ConversionError."""
    if not isinstance(node, dict) or len(node) != 1:
        raise ConversionError("a stored state node is not an object with one key")
    ((kind, payload),) = node.items()
    try:
        if kind == "tensor":
            return array_to_tensor(arrays[payload])
        if kind == "dict":
            return {key: _decode(item, arrays) for key, item in payload}
        if kind == "list":
            return [_decode(item, arrays) for item in payload]
        if kind == "tuple":
            return tuple(_decode(item, arrays) for item in payload)
        if kind == "float":
            return float(payload)
    except ConversionError:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise ConversionError(f"a stored {kind!r} state node is malformed: {exc}") from None
    if kind == "value":
        return payload
    raise ConversionError(f"unknown state node kind {kind!r}")


def save_state(state: dict[str, Any], into: RecordDict) -> None:
    """Store ``ctx.state`` in a Flower ``Context.state`` (replacing what was there)."""
    arrays = ArrayRecord()
    tree = _encode(state, "state", arrays)
    into[STATE_ARRAYS] = arrays
    into[STATE_TREE] = ConfigRecord({"tree": json.dumps(tree, allow_nan=False)})


def load_state(source: RecordDict) -> dict[str, Any]:
    """The ``ctx.state`` stored by :func:`save_state` (empty dict for a fresh context)."""
    if STATE_TREE not in source:
        return {}
    tree = parse_json(source[STATE_TREE]["tree"], ConversionError, "the client's stored state")
    return _decode(tree, source[STATE_ARRAYS])
