"""The worker's request parsing is linear (#34 item 4): the JSON depth count is exact on any
JSON text, a 16 MiB head of any hostile shape is parsed or refused within a second of CPU,
and a request past its CPU budget is refused in one line."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("flwr", reason="flwr is not installed; pip install -e '.[flower]'")

from fedshift.core.bounded import nesting_depth  # noqa: E402
from fedshift.engine.flower.transport import wire  # noqa: E402

#: the bound the issue asks for: a maximal legal head is parsed (or refused) within this
#: many seconds of the parsing thread's CPU time (measured here: 0.06-0.13 s on 2 loaded cores)
PARSE_BOUND_S = 1.0

#: text that stresses a string scanner: quotes, backslashes and brackets inside strings
TRICKY = st.text(alphabet='"\\[]{}ab', max_size=12)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | TRICKY,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TRICKY, inner, max_size=4),
    max_leaves=40,
)


@settings(max_examples=400, deadline=None)
@given(JSON_VALUES)
def test_json_depth_is_the_nesting_depth_of_any_json_text(value):
    assert wire.json_depth(json.dumps(value).encode()) == nesting_depth(value)


#: 16 MiB heads (the largest the worker reads): the issue's escaped quotes, bare or inside a
#: legal head, and the other shapes a scanner may choke on
HEADS = {
    "escaped quotes": b'\\"' * (wire.MAX_JSON // 2),
    "one string of escaped quotes": b'{"op": "ping", "x": "'
    + b'\\"' * ((wire.MAX_JSON - 24) // 2)
    + b'"}',
    "an unclosed string of escaped quotes": b'"' + b'\\"' * ((wire.MAX_JSON - 1) // 2),
    "quotes": b'"' * wire.MAX_JSON,
    "backslashes": b"\\" * wire.MAX_JSON,
    "open brackets": b"[" * wire.MAX_JSON,
    "brackets in a string": b'["' + b"[" * (wire.MAX_JSON - 4) + b'"]',
}


@pytest.mark.parametrize("name", list(HEADS))
def test_a_16_mib_head_is_parsed_within_a_second_of_cpu(name):
    head = HEADS[name]
    assert len(head) <= wire.MAX_JSON
    start = time.thread_time()
    try:
        wire.load_json(head)
    except wire.ProtocolError:
        pass
    spent = time.thread_time() - start
    assert spent < PARSE_BOUND_S, f"{name}: {spent:.2f} s of CPU"


def test_the_depth_of_a_head_of_escaped_quotes_is_counted_outside_strings():
    assert wire.json_depth(b'"\\"[\\\\"[') == 1  # the first bracket is in a string
    assert wire.json_depth(b'["\\\\\\"]"]') == 1
    assert wire.json_depth(HEADS["brackets in a string"]) == 1


def test_a_request_past_its_cpu_budget_is_refused():
    with pytest.raises(wire.ProtocolError, match="beyond its budget of 0 s"):
        wire.load_json(b'{"op": "ping"}', wire.CpuBudget(0.0))
    assert wire.load_json(b'{"op": "ping"}', wire.CpuBudget(5.0)) == {"op": "ping"}
