"""The local socket protocol between a ClientApp process and the node's resident worker.

Kept free of torch (numpy and ``flwr.app`` only), because the per-message ClientApp
process imports it. A message is one JSON frame followed by one frame per array; a frame
is ``MAGIC`` + a 4-byte big-endian length + the payload. Arrays travel as the ``.npy``
bytes Flower already holds (``Array.data``) and are re-read with
``np.load(allow_pickle=False)`` and checked against the dtype and shape announced in the
JSON frame before they become Flower ``Array`` objects again; nothing is unpickled. Records
are described as ``[name, kind, items]`` with ``kind`` one of ``array``, ``config``,
``metric``; config values that JSON cannot carry as themselves (bytes) are tagged.
"""

from __future__ import annotations

import base64
import io
import json
import math
import socket
import struct
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

MAGIC = b"FSW1"
HEADER = struct.Struct(">4sI")
#: the largest JSON frame (descriptions, configs, metrics)
MAX_JSON = 64 << 20
#: the largest array frame (one tensor's .npy bytes)
MAX_ARRAY = 1 << 30
#: the most bytes one message may carry in all
MAX_TOTAL = 4 << 30
#: the most arrays one message may carry
MAX_ARRAYS = 100_000
NUMPY = "numpy.ndarray"


class ProtocolError(ValueError):
    """A frame or message that breaks the protocol (one line, names the problem)."""


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise ConnectionError(f"connection closed after {got} of {size} bytes")
        got += n
    return bytes(buffer)


def send_frames(sock: socket.socket, frames: Iterable[bytes]) -> None:
    for payload in frames:
        sock.sendall(HEADER.pack(MAGIC, len(payload)))
        sock.sendall(payload)


def recv_frame(sock: socket.socket, limit: int) -> bytes:
    """One frame's payload; a wrong magic or a length above ``limit`` is refused unread."""
    magic, length = HEADER.unpack(_recv_exact(sock, HEADER.size))
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic!r}")
    if length > limit:
        raise ProtocolError(f"frame of {length} bytes exceeds the limit of {limit}")
    return _recv_exact(sock, length)


# -- records ---------------------------------------------------------------------------------


def _encode_value(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"bytes": base64.b64encode(value).decode()}
    if isinstance(value, list):
        return [_encode_value(v) for v in value]
    return value


def _decode_value(value: Any, where: str) -> Any:
    if isinstance(value, dict):
        if set(value) != {"bytes"} or not isinstance(value["bytes"], str):
            raise ProtocolError(f"{where}: unknown tagged value")
        try:
            return base64.b64decode(value["bytes"], validate=True)
        except ValueError:
            raise ProtocolError(f"{where}: bad base64") from None
    if isinstance(value, list):
        return [_decode_value(v, where) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise ProtocolError(f"{where}: unsupported value {type(value).__name__}")


def encode_records(records: RecordDict) -> tuple[list[Any], list[bytes]]:
    """A JSON-able description of ``records`` and the ``.npy`` bytes of its arrays."""
    described: list[Any] = []
    blobs: list[bytes] = []
    for name, record in records.items():
        if isinstance(record, ArrayRecord):
            items = []
            for key, array in record.items():
                if array.stype != NUMPY:
                    raise ProtocolError(f"array {name}/{key} has stype {array.stype!r}")
                items.append([key, array.dtype, list(array.shape)])
                blobs.append(bytes(array.data))
            described.append([name, "array", items])
        elif isinstance(record, MetricRecord):
            described.append([name, "metric", [[k, v] for k, v in record.items()]])
        elif isinstance(record, ConfigRecord):
            described.append([name, "config", [[k, _encode_value(v)] for k, v in record.items()]])
        else:
            raise ProtocolError(f"record {name!r} is a {type(record).__name__}")
    return described, blobs


def _array(where: str, dtype: Any, shape: Any, blob: bytes) -> Array:
    """A Flower Array from announced dtype/shape and .npy bytes, checked without pickle."""
    if not isinstance(dtype, str) or not isinstance(shape, list):
        raise ProtocolError(f"{where}: bad dtype or shape")
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise ProtocolError(f"{where}: bad shape {shape!r}")
    try:
        loaded = np.load(io.BytesIO(blob), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ProtocolError(f"{where}: unreadable .npy ({exc})") from None
    if not isinstance(loaded, np.ndarray) or loaded.dtype.hasobject:
        raise ProtocolError(f"{where}: not a plain array")
    if str(loaded.dtype) != dtype or list(loaded.shape) != shape:
        raise ProtocolError(
            f"{where}: holds {loaded.dtype}{list(loaded.shape)}, announced {dtype}{shape}"
        )
    return Array(dtype=dtype, shape=tuple(shape), stype=NUMPY, data=blob)


def _metric(where: str, value: Any) -> Any:
    def number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    if number(value) or (isinstance(value, list) and all(number(v) for v in value)):
        return value
    raise ProtocolError(f"{where}: metric value is not a number or list of numbers")


def decode_records(described: Any, blobs: list[bytes]) -> RecordDict:
    """The RecordDict that :func:`encode_records` described; every part is checked."""
    if not isinstance(described, list):
        raise ProtocolError("records are not a list")
    records = RecordDict()
    pending = iter(blobs)
    for entry in described:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)):
            raise ProtocolError("record entry is not [name, kind, items]")
        name, kind, items = entry
        if not isinstance(items, list) or not all(
            isinstance(i, list) and i and isinstance(i[0], str) for i in items
        ):
            raise ProtocolError(f"record {name!r}: items are not [key, ...] lists")
        if kind == "array":
            record = ArrayRecord()
            for item in items:
                if len(item) != 3:
                    raise ProtocolError(f"record {name!r}: array item is not [key, dtype, shape]")
                blob = next(pending, None)
                if blob is None:
                    raise ProtocolError(f"record {name!r}: fewer array frames than arrays")
                record[item[0]] = _array(f"array {name}/{item[0]}", item[1], item[2], blob)
        elif kind == "metric":
            if any(len(item) != 2 for item in items):
                raise ProtocolError(f"record {name!r}: metric item is not [key, value]")
            record = MetricRecord({k: _metric(f"metric {name}/{k}", v) for k, v in items})
        elif kind == "config":
            if any(len(item) != 2 for item in items):
                raise ProtocolError(f"record {name!r}: config item is not [key, value]")
            record = ConfigRecord({k: _decode_value(v, f"config {name}/{k}") for k, v in items})
        else:
            raise ProtocolError(f"record {name!r} has unknown kind {kind!r}")
        if name in records:
            raise ProtocolError(f"record {name!r} appears twice")
        records[name] = record
    if next(pending, None) is not None:
        raise ProtocolError("more array frames than arrays")
    return records


def count_arrays(described: Any) -> int:
    """How many array frames follow a message whose records are ``described``."""
    if not isinstance(described, list):
        raise ProtocolError("records are not a list")
    total = 0
    for entry in described:
        if isinstance(entry, list) and len(entry) == 3 and entry[1] == "array":
            if not isinstance(entry[2], list):
                raise ProtocolError("array items are not a list")
            total += len(entry[2])
    return total


# -- messages: a JSON head, then the arrays of the records it names ---------------------------


def send_message(sock: socket.socket, head: dict[str, Any], parts: dict[str, RecordDict]) -> None:
    """``head`` plus the records ``parts`` (described under ``head["records"]``)."""
    described: dict[str, Any] = {}
    blobs: list[bytes] = []
    for key, records in parts.items():
        described[key], part_blobs = encode_records(records)
        blobs += part_blobs
    payload = json.dumps({**head, "records": described}).encode()
    send_frames(sock, [payload, *blobs])


def recv_message(sock: socket.socket) -> tuple[dict[str, Any], dict[str, RecordDict]]:
    """A head (a JSON object) and its decoded records, all within the size limits."""
    try:
        head = json.loads(recv_frame(sock, MAX_JSON))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"head is not JSON ({exc.__class__.__name__})") from None
    if not isinstance(head, dict):
        raise ProtocolError("head is not a JSON object")
    described = head.pop("records", {})
    if not isinstance(described, dict):
        raise ProtocolError("records are not an object")
    wanted = [count_arrays(d) for d in described.values()]
    if sum(wanted) > MAX_ARRAYS:
        raise ProtocolError(f"{sum(wanted)} arrays exceed the limit of {MAX_ARRAYS}")
    total = 0
    parts: dict[str, RecordDict] = {}
    for (key, records), n in zip(described.items(), wanted, strict=True):
        blobs = []
        for _ in range(n):
            blobs.append(recv_frame(sock, MAX_ARRAY))
            total += len(blobs[-1])
            if total > MAX_TOTAL:
                raise ProtocolError(f"message exceeds {MAX_TOTAL} bytes")
        parts[key] = decode_records(records, blobs)
    return head, parts


def finite_or_none(value: Any) -> float | None:
    """A positive finite number of seconds, else None (used for node-config timeouts)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None
