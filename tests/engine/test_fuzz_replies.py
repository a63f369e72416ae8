"""Property test: random malformed replies through the shared validation into every
registered algorithm's server program. The server never raises, the global state never
changes dtype or shape, and one client cannot move FedAvg's model beyond its weight.

Each algorithm's honest replies of one round are recorded once on a tiny task; each example
replays that round with one client's reply damaged in random ways.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_contract import FAST_SETTINGS, backbone_settings, make_cfg

from fedshift.algorithms import REGISTRY
from fedshift.core.errors import RoundFailed
from fedshift.core.record import Record
from fedshift.engine.assembly import prepare
from fedshift.engine.federation import BaseFederation, federation_options
from fedshift.engine.simulation.dispatch import SimulationFederation

_RECORDED: dict[str, tuple] = {}


class RecordingFederation(SimulationFederation):
    """The simulation engine, keeping a copy of every raw reply by (round, call, client)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.raw: dict[tuple[int, int, int], Record] = {}

    def _dispatch(self, task, sends, call_index):
        for cid, reply in super()._dispatch(task, sends, call_index):
            self.raw[(self.round, call_index, cid)] = copy.deepcopy(reply)
            yield cid, reply


class ReplayFederation(BaseFederation):
    """Replays recorded replies of round 1; ``damage`` changes one client's reply."""

    def __init__(self, exp, raw, target=None, damage=None):
        roles = {cid: ctx.role for cid, ctx in exp.contexts.items()}
        options = {**federation_options(exp), "failure_policy": "resilient"}
        super().__init__(exp.algorithm, roles, **options)
        self.raw, self.target, self.damage = raw, target, damage
        self.server_data = exp.server_data

    def _dispatch(self, task, sends, call_index):
        out = {}
        for cid in sends:
            key = (1, call_index, cid)
            if key not in self.raw:
                continue
            reply = copy.deepcopy(self.raw[key])
            if key == self.target:
                reply = self.damage(reply)
            out[cid] = reply
        return out.items()

    def score_clients(self, with_domains):
        return {}


def recorded(algorithm, tmp_path_factory, dataset):
    """(experiment, state before round 1, honest replies, honest state after round 1)."""
    if algorithm not in _RECORDED:
        tmp = tmp_path_factory.mktemp(f"fuzz-{algorithm}")
        overrides = {
            **backbone_settings(REGISTRY[algorithm], tmp, dataset),
            **FAST_SETTINGS.get(algorithm, {}),
        }
        cfg = make_cfg(algorithm, rounds=1, failure_policy="resilient", **overrides)
        exp = prepare(cfg, dataset=dataset)
        fed = RecordingFederation(exp.algorithm, exp.contexts, **federation_options(exp))
        fed.server_data = exp.server_data
        fed.begin_round(0)
        state = exp.algorithm.setup(exp.algorithm.init_state(), fed)
        start = copy.deepcopy(state)
        contexts = copy.deepcopy({cid: ctx.state for cid, ctx in exp.contexts.items()})
        fed.begin_round(1)
        exp.algorithm.round(state, fed)
        for cid, ctx in exp.contexts.items():  # replays start from the same client states
            ctx.state = contexts[cid]
        raw = {k: v for k, v in fed.raw.items() if k[0] == 1}
        honest = replay(exp, start, raw)[0]
        _RECORDED[algorithm] = (exp, start, raw, honest)
    return _RECORDED[algorithm]


def replay(exp, start, raw, target=None, damage=None):
    fed = ReplayFederation(exp, raw, target, damage)
    fed.begin_round(1)
    state, _ = exp.algorithm.round(copy.deepcopy(start), fed)
    return state, fed


DTYPES = [torch.float32, torch.float64, torch.float16, torch.int64, torch.int8, torch.bool]
FILLS = [0.0, 1.0, -1.0, 3.5, math.nan, math.inf, -math.inf, 1e30, -1e30, 1e5]
METRIC_VALUES = [-1, 0, 1, 7, 10**9, 1e308, 7.5, math.nan, math.inf, "12", None, True, [1]]


def random_tensor(data, like: torch.Tensor | None) -> torch.Tensor:
    dtype = data.draw(st.sampled_from(DTYPES))
    if like is not None and data.draw(st.booleans()):
        shape = tuple(like.shape)
    else:
        shape = tuple(data.draw(st.lists(st.integers(0, 4), max_size=3)))
    fill = data.draw(st.sampled_from(FILLS))
    values = torch.full(shape, fill, dtype=torch.float64)
    if dtype.is_floating_point:
        return values.to(dtype)
    return torch.nan_to_num(values, posinf=7, neginf=-7).clamp(-100, 100).to(dtype)


def damage_from(data, reply: Record):
    """A function applying 1-3 random damages to a reply (drawn now, applied on replay)."""
    steps = []
    for _ in range(data.draw(st.integers(1, 3))):
        op = data.draw(
            st.sampled_from(
                ["replace", "drop", "add", "metric", "drop-metric", "scale", "not-record"]
            )
        )
        keys = sorted(reply.arrays)
        if op == "replace" and keys:
            key = data.draw(st.sampled_from(keys))
            steps.append(("replace", key, random_tensor(data, reply.arrays[key])))
        elif op == "drop" and keys:
            steps.append(("drop", data.draw(st.sampled_from(keys)), None))
        elif op == "add":
            base = keys[0].split(".", 1)[0] if keys else "model"
            key = data.draw(st.sampled_from([f"{base}.extra", "undeclared.x", f"{base}"]))
            steps.append(("add", key, random_tensor(data, None)))
        elif op == "metric":
            key = data.draw(st.sampled_from(["num-examples", "samples", "loss", "new"]))
            steps.append(("metric", key, data.draw(st.sampled_from(METRIC_VALUES))))
        elif op == "drop-metric":
            steps.append(("drop-metric", "num-examples", None))
        elif op == "scale":
            steps.append(("scale", None, data.draw(st.sampled_from([1e3, -1e3, 1e6, 1e-3]))))
        elif op == "not-record":
            steps.append(("not-record", None, data.draw(st.sampled_from([None, {}, "x", 3]))))

    def apply(reply):
        for op, key, value in steps:
            if op == "not-record":
                return value
            if op in ("replace", "add"):
                reply.arrays[key] = value.clone()
            elif op == "drop":
                reply.arrays.pop(key, None)
            elif op == "metric":
                reply.metrics[key] = value
            elif op == "drop-metric":
                reply.metrics.pop(key, None)
            elif op == "scale":
                reply.arrays = {
                    k: v * value if v.is_floating_point() else v for k, v in reply.arrays.items()
                }
        return reply

    return apply


def tensors_of(state) -> dict[str, torch.Tensor]:
    found = {f"model.{k}": v for k, v in state.model.items()}
    for name, value in vars(state).items():
        if isinstance(value, dict) and name != "model":
            found.update(
                {f"{name}.{k}": v for k, v in value.items() if isinstance(v, torch.Tensor)}
            )
    return found


@pytest.mark.parametrize("algorithm", sorted(REGISTRY))
@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_malformed_replies_never_break_the_server(
    algorithm, data, tmp_path_factory, micro_digits
):
    exp, start, raw, honest = recorded(algorithm, tmp_path_factory, micro_digits)
    if not raw:
        pytest.skip(f"{algorithm} exchanges no arrays")
    target = data.draw(st.sampled_from(sorted(raw)))
    damage = damage_from(data, raw[target])
    try:
        state, fed = replay(exp, start, raw, target, damage)
    except RoundFailed as failed:
        # a call of one client (FACT's, FADA's target client) got no valid reply: the
        # damaged one itself, or a recorded reply that no longer fits once a damaged source
        # reply was dropped (FADA's attention gains, one per surviving source); nobody
        # replied, so the round fails under every policy, with one line
        assert "none of 1 clients replied" in str(failed), failed
        return
    expected = tensors_of(honest)
    got = tensors_of(state)
    assert got.keys() == expected.keys()
    for key, value in got.items():
        assert value.dtype == expected[key].dtype and value.shape == expected[key].shape, key
        if value.is_floating_point():
            assert bool(torch.isfinite(value).all()), key
    if algorithm == "fedavg" and target[2] not in fed.failed_ids:
        # an accepted reply moves the mean by at most its largest possible weight times
        # its largest possible value (num-examples <= the client's size, |values| bounded)
        cid = target[2]
        others = sum(r.metrics["num-examples"] for k, r in raw.items() if k[2] != cid)
        size = fed.data_sizes[cid]
        weight = size / (size + others)
        honest_reply = raw[target].subset("model")
        for key, value in state.model.items():
            if not value.is_floating_point():
                continue
            bound = weight * (fed.max_reply_value + float(honest_reply[key].abs().max()))
            assert float((value - honest.model[key]).abs().max()) <= bound * (1 + 1e-6), key


# -- Flower reply arrays: random .npy headers, never an allocation beyond the bytes at hand ---

DESCRS = ["<f4", ">f4", "<f8", "<f2", "|b1", "<i8", "|u1", "<c8", "|O", "<U3", "|V8", "<M8[s]"]


def npy_blob(data) -> tuple[bytes, tuple[int, ...], str]:
    """A ``.npy`` header (random dtype, shape up to 2**40 per side, order) followed by a
    random number of data bytes (exactly enough, a few too many or too few, or none)."""
    import io

    import numpy as np

    descr = data.draw(st.sampled_from(DESCRS))
    shape = tuple(data.draw(st.lists(st.integers(0, 2**40) | st.integers(0, 5), max_size=3)))
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": descr, "fortran_order": data.draw(st.booleans()), "shape": shape}
    )
    needed = math.prod(shape) * np.dtype(descr).itemsize
    size = data.draw(
        st.sampled_from([needed, needed + 1, max(needed - 1, 0), 0, 7]).filter(lambda n: n < 4096)
        | st.integers(0, 64)
    )
    return header.getvalue() + bytes(size), shape, descr


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_random_npy_headers_never_allocate_beyond_the_reply(data):
    """A Flower reply array is loaded only when its header is a plain number array's and
    announces exactly the bytes that follow it; anything else is a ConversionError (a
    failed client), never a MemoryError or another exception."""
    flwr_app = pytest.importorskip("flwr.app", reason="flwr is not installed")
    from fedshift.engine.flower.convert import ConversionError, array_to_tensor

    blob, shape, descr = npy_blob(data)
    dtype_name = str(__import__("numpy").dtype(descr))
    array = flwr_app.Array(dtype=dtype_name, shape=shape, stype="numpy.ndarray", data=blob)
    try:
        tensor = array_to_tensor(array)
    except ConversionError:
        return
    assert tuple(tensor.shape) == shape
    assert tensor.numel() * tensor.element_size() <= len(blob)
