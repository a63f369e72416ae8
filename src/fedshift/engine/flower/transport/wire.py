"""The local socket protocol between a ClientApp process and the node's resident worker.

Kept free of torch (numpy and ``flwr.app`` only), because the per-message ClientApp
process imports it. A request opens with a fixed-size prologue, ``AUTH_MAGIC`` + the
worker's 64-character secret, which the worker reads and compares before it reads
anything else, so a process without the secret can make it read 68 bytes and no more.
Then come one JSON frame and one frame per array; a frame is ``MAGIC`` + a 4-byte
big-endian length + the payload. Every bound is checked before anything is allocated: the
JSON head is at most :data:`MAX_JSON` bytes nested at most :data:`MAX_DEPTH` deep; the
arrays it announces have an allowed dtype, at most :data:`MAX_ARRAY` bytes each and
:data:`MAX_TOTAL` in all, and each array frame must be as long as its announced dtype and
shape say. Arrays travel as the ``.npy`` bytes Flower already holds (``Array.data``); their
``.npy`` header is read on its own and must match the announcement and the bytes that
follow it, so they become Flower ``Array`` objects again without ``np.load`` and nothing is
unpickled. A reader may pass a deadline for the whole message (not per ``recv``) and a
budget of CPU seconds for decoding it (:class:`CpuBudget`); every check is linear in the
bytes it reads, the JSON depth count included (:func:`json_depth`). Records
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
import time
import tokenize
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

MAGIC = b"FSW1"
HEADER = struct.Struct(">4sI")
#: the opening of every request: ``AUTH_MAGIC`` and the worker's secret (64 hex digits)
AUTH_MAGIC = b"FSA1"
PROLOGUE = struct.Struct(">4s64s")
#: the largest JSON frame (descriptions, configs, metrics)
MAX_JSON = 16 << 20
#: the deepest nesting of lists and objects a JSON frame may hold
MAX_DEPTH = 64
#: the largest array (one tensor's data bytes)
MAX_ARRAY = 1 << 30
#: the most bytes one message's arrays may carry in all
MAX_TOTAL = 4 << 30
#: the most arrays one message may carry
MAX_ARRAYS = 100_000
#: the longest ``.npy`` header (magic, version, length and the header dict) an array frame
#: may put before its data
MAX_NPY_HEADER = 1 << 12
#: the dtypes an array may have: numbers and booleans in native byte order
DTYPES = frozenset(
    (
        "bool",
        *(f"int{bits}" for bits in (8, 16, 32, 64)),
        *(f"uint{bits}" for bits in (8, 16, 32, 64)),
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    )
)
NUMPY = "numpy.ndarray"


class ProtocolError(ValueError):
    """A frame or message that breaks the protocol (one line, names the problem)."""


def prologue(secret: str) -> bytes:
    """The fixed-size opening of a request to the worker holding ``secret``."""
    key = secret.encode()
    if len(key) != 64:
        raise ProtocolError("a worker secret has 64 characters")
    return PROLOGUE.pack(AUTH_MAGIC, key)


def recv_exact(sock: socket.socket, size: int, deadline: float | None = None) -> bytes:
    """``size`` bytes from ``sock``; with ``deadline`` (a ``time.monotonic()`` value), all of
    them before it, however slowly they trickle in (else :class:`ProtocolError`)."""
    buffer = bytearray(size)
    view = memoryview(buffer)
    got = 0
    while got < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ProtocolError(f"the request was not complete by its deadline ({got} bytes)")
            sock.settimeout(left)
        try:
            n = sock.recv_into(view[got:], size - got)
        except TimeoutError:
            if deadline is None:
                raise
            continue  # the deadline check above refuses it
        if n == 0:
            raise ConnectionError(f"connection closed after {got} of {size} bytes")
        got += n
    return bytes(buffer)


def send_frames(sock: socket.socket, frames: Iterable[bytes]) -> None:
    for payload in frames:
        sock.sendall(HEADER.pack(MAGIC, len(payload)))
        sock.sendall(payload)


def recv_frame(
    sock: socket.socket, limit: int, deadline: float | None = None, *, at_least: int = 0
) -> bytes:
    """One frame's payload; a wrong magic or a length outside ``at_least``..``limit`` is
    refused before the payload is read (or any room made for it)."""
    magic, length = HEADER.unpack(recv_exact(sock, HEADER.size, deadline))
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {magic!r}")
    if length > limit:
        raise ProtocolError(f"frame of {length} bytes exceeds the limit of {limit}")
    if length < at_least:
        raise ProtocolError(f"frame of {length} bytes is shorter than the {at_least} announced")
    return recv_exact(sock, length, deadline)


class CpuBudget:
    """Seconds of this thread's CPU time one request may spend being read and decoded;
    :meth:`check` between steps refuses (:class:`ProtocolError`) a request past it. Every
    step is linear in its input, so a step overruns the budget by at most its own length."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.start = time.thread_time()

    def check(self, doing: str) -> None:
        spent = time.thread_time() - self.start
        if spent > self.seconds:
            raise ProtocolError(
                f"the request used {spent:.1f} s of CPU {doing}, beyond its budget of "
                f"{self.seconds:g} s"
            )


def json_depth(payload: bytes, budget: CpuBudget | None = None) -> int:
    """How deep lists and objects nest in the JSON text ``payload`` (an upper bound for
    malformed text), counted without parsing, so a parser's recursion is never reached.

    Linear: escaped backslashes, then escaped quotes are dropped (``bytes.replace``, left to
    right, as a JSON reader pairs them), so every quote left opens or closes a string; a
    bracket counts when an even number of quotes precedes it. (A regular expression that
    blanked out strings first was quadratic in a head of escaped quotes.) Scratch memory:
    about six bytes per byte of ``payload``."""
    text = payload.replace(b"\\\\", b"").replace(b'\\"', b"")
    data = np.frombuffer(text, dtype=np.uint8)
    # the count of quotes so far, modulo 256 (only its parity matters): 1 inside a string
    inside = np.cumsum(data == ord('"'), dtype=np.uint8) & 1
    if budget is not None:
        budget.check("counting the JSON head's depth")
    steps = ((data == ord("[")) | (data == ord("{"))).view(np.int8)
    steps = (steps - ((data == ord("]")) | (data == ord("}"))).view(np.int8)) * (inside ^ 1)
    steps = steps[steps != 0]  # the brackets outside strings
    return int(np.cumsum(steps, dtype=np.int32).max(initial=0))


def load_json(payload: bytes, budget: CpuBudget | None = None) -> Any:
    """``payload`` parsed as JSON, refused (:class:`ProtocolError`) when it nests deeper
    than :data:`MAX_DEPTH`, is not JSON or runs past ``budget``."""
    depth = json_depth(payload, budget)
    if depth > MAX_DEPTH:
        raise ProtocolError(f"JSON nested {depth} deep, beyond the limit of {MAX_DEPTH}")
    try:
        value = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"not JSON ({exc.__class__.__name__})") from None
    except RecursionError:  # cannot happen after the count above; never fatal all the same
        raise ProtocolError(f"JSON nested beyond the limit of {MAX_DEPTH}") from None
    if budget is not None:
        budget.check("parsing the JSON head")
    return value


#: the .npy format versions read (3.0 only adds UTF-8 field names, which no array here has)
_HEADER_READERS = {
    (1, 0): np.lib.format.read_array_header_1_0,
    (2, 0): np.lib.format.read_array_header_2_0,
}


def npy_layout(blob: bytes) -> tuple[np.dtype, tuple[int, ...], int]:
    """The dtype, shape and header length a ``.npy`` blob announces, read from its header
    alone and checked before anything is allocated: a dtype of :data:`DTYPES` in native
    byte order, at most :data:`MAX_ARRAY` data bytes, and exactly as many data
    bytes after the header as dtype and shape need. So a 128-byte header announcing a
    373 GiB array is refused, as is any object, string or structured array."""
    stream = io.BytesIO(blob)
    try:
        version = np.lib.format.read_magic(stream)
        read_header = _HEADER_READERS.get(version)
        if read_header is not None:
            shape, _, dtype = read_header(stream)
    except (
        ValueError,
        TypeError,
        SyntaxError,
        tokenize.TokenError,
        RecursionError,
        MemoryError,
        EOFError,
    ) as exc:
        text = " ".join(str(exc).split())[:200]
        raise ProtocolError(f"unreadable .npy header ({exc.__class__.__name__}: {text})") from None
    if read_header is None:
        raise ProtocolError(f".npy format version {version} is not read")
    if dtype.hasobject or dtype.name not in DTYPES or not dtype.isnative:
        raise ProtocolError(f".npy dtype {dtype} is not a plain number or bool dtype")
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > MAX_ARRAY:
        raise ProtocolError(
            f".npy header announces {dtype}{list(shape)}: {nbytes} bytes, "
            f"beyond the limit of {MAX_ARRAY}"
        )
    offset = stream.tell()
    if len(blob) - offset != nbytes:
        raise ProtocolError(
            f".npy header announces {dtype}{list(shape)} ({nbytes} bytes) "
            f"but {len(blob) - offset} data bytes follow"
        )
    return dtype, tuple(shape), offset


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


def _array(where: str, dtype: str, shape: list[int], blob: bytes) -> Array:
    """A Flower Array from its checked announcement and .npy bytes, without ``np.load``."""
    found, found_shape, _ = npy_layout(blob)
    if str(found) != dtype or list(found_shape) != shape:
        raise ProtocolError(f"{where}: holds {found}{list(found_shape)}, announced {dtype}{shape}")
    return Array(dtype=dtype, shape=tuple(shape), stype=NUMPY, data=blob)


def _announced(where: str, item: Any) -> tuple[str, list[int], int]:
    """The dtype, shape and data bytes an ``[key, dtype, shape]`` item announces, checked:
    a dtype of :data:`DTYPES`, a list of sizes, at most :data:`MAX_ARRAY` bytes."""
    if not isinstance(item, list) or len(item) != 3:
        raise ProtocolError(f"{where}: array item is not [key, dtype, shape]")
    _, dtype, shape = item
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ProtocolError(f"{where}: dtype {str(dtype)[:40]!r} is not allowed")
    if not isinstance(shape, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape
    ):
        raise ProtocolError(f"{where}: bad shape")
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    if nbytes > MAX_ARRAY:
        raise ProtocolError(f"{where}: {nbytes} bytes exceed the limit of {MAX_ARRAY}")
    return dtype, shape, nbytes


def _metric(where: str, value: Any) -> Any:
    def number(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool)

    if number(value) or (isinstance(value, list) and all(number(v) for v in value)):
        return value
    raise ProtocolError(f"{where}: metric value is not a number or list of numbers")


def _check_entry(entry: Any) -> tuple[str, str, list[Any]]:
    if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)):
        raise ProtocolError("record entry is not [name, kind, items]")
    name, kind, items = entry
    if not isinstance(items, list) or not all(
        isinstance(i, list) and i and isinstance(i[0], str) for i in items
    ):
        raise ProtocolError(f"record {name!r}: items are not [key, ...] lists")
    return name, kind, items


def announced_arrays(described: Any) -> list[int]:
    """The data bytes of each array frame that follows a message whose records are
    ``described``, in order; every announcement is checked (:func:`_announced`)."""
    if not isinstance(described, list):
        raise ProtocolError("records are not a list")
    sizes = []
    for entry in described:
        name, kind, items = _check_entry(entry)
        if kind == "array":
            sizes += [_announced(f"array {name}/{i[0]}", i)[2] for i in items]
    return sizes


def decode_records(described: Any, blobs: list[bytes]) -> RecordDict:
    """The RecordDict that :func:`encode_records` described; every part is checked."""
    if not isinstance(described, list):
        raise ProtocolError("records are not a list")
    records = RecordDict()
    pending = iter(blobs)
    for entry in described:
        name, kind, items = _check_entry(entry)
        if kind == "array":
            record = ArrayRecord()
            for item in items:
                where = f"array {name}/{item[0]}"
                dtype, shape, _ = _announced(where, item)
                blob = next(pending, None)
                if blob is None:
                    raise ProtocolError(f"record {name!r}: fewer array frames than arrays")
                record[item[0]] = _array(where, dtype, shape, blob)
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


# -- messages: a JSON head, then the arrays of the records it names ---------------------------


def send_message(
    sock: socket.socket,
    head: dict[str, Any],
    parts: dict[str, RecordDict],
    *,
    secret: str | None = None,
) -> None:
    """``head`` plus the records ``parts`` (described under ``head["records"]``); a request
    to the worker opens with its ``secret`` (:func:`prologue`)."""
    described: dict[str, Any] = {}
    blobs: list[bytes] = []
    for key, records in parts.items():
        described[key], part_blobs = encode_records(records)
        blobs += part_blobs
    payload = json.dumps({**head, "records": described}).encode()
    if secret is not None:
        sock.sendall(prologue(secret))
    send_frames(sock, [payload, *blobs])


def recv_message(
    sock: socket.socket, deadline: float | None = None, budget: CpuBudget | None = None
) -> tuple[dict[str, Any], dict[str, RecordDict]]:
    """A head (a JSON object) and its decoded records, all within the limits (and by
    ``deadline``, a ``time.monotonic()`` value, and within the CPU ``budget``, when given).

    The head's announcements are checked, in all, before the first array frame is read,
    and each array frame's length against its announcement before its bytes are.
    """
    head = load_json(recv_frame(sock, MAX_JSON, deadline), budget)
    if not isinstance(head, dict):
        raise ProtocolError("head is not a JSON object")
    described = head.pop("records", {})
    if not isinstance(described, dict):
        raise ProtocolError("records are not an object")
    sizes = {key: announced_arrays(d) for key, d in described.items()}
    count = sum(len(s) for s in sizes.values())
    if count > MAX_ARRAYS:
        raise ProtocolError(f"{count} arrays exceed the limit of {MAX_ARRAYS}")
    total = sum(sum(s) for s in sizes.values())
    if total > MAX_TOTAL:
        raise ProtocolError(f"the arrays announce {total} bytes, beyond the limit of {MAX_TOTAL}")
    parts: dict[str, RecordDict] = {}
    for key, records in described.items():
        blobs = [
            recv_frame(sock, nbytes + MAX_NPY_HEADER, deadline, at_least=nbytes)
            for nbytes in sizes[key]
        ]
        parts[key] = decode_records(records, blobs)
        if budget is not None:
            budget.check(f"decoding the request's {key[:40]!r} records")
    return head, parts


def finite_or_none(value: Any) -> float | None:
    """A positive finite number of seconds, else None (used for node-config timeouts)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None
