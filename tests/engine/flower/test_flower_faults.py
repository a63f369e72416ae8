"""Hostile SuperNodes: tampered replies and false identities never crash the ServerApp.

Every fault of :mod:`fedshift.engine.flower.faults` is sent by one of three nodes. In
process (the real ServerApp and fault-injecting ClientApp code over a small grid), each
tampered reply must make that client a failed client with a one-line reason, and leave the
global model exactly as if the node had not answered at all. On loopback (``flower``
marker), real SuperNodes send tampered replies and false identities over the wire.
"""

from __future__ import annotations

import io
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import read_history

pytest.importorskip("flwr", reason="flwr is not installed; pip install -e '.[flower]'")

from flwr.app import Array, ConfigRecord, Context, RecordDict  # noqa: E402
from test_flower import (  # noqa: E402
    Cluster,
    LocalGrid,
    e2e_settings,
    flower_bin,
    run_config,
    wait_run,
)

from fedshift.core.errors import ConfigError, RoundFailed  # noqa: E402
from fedshift.core.record import Record  # noqa: E402
from fedshift.core.state import load_checkpoint  # noqa: E402
from fedshift.engine.flower import clientapp, faults, serverapp  # noqa: E402
from fedshift.engine.flower.convert import (  # noqa: E402
    ConversionError,
    from_recorddict,
    to_recorddict,
)
from fedshift.engine.flower.messages import CONTROL, REFUSED  # noqa: E402
from fedshift.engine.flower.serverapp import run_on_grid  # noqa: E402
from fedshift.engine.flower.settings import node_client_id  # noqa: E402

FAULTY = 2  # the partition of the hostile node


def refused_nodes(grid: LocalGrid) -> list[int]:
    """The nodes the ServerApp told that they were refused."""
    return [
        node
        for node, message in grid.pushed
        if CONTROL in message.content and message.content[CONTROL]["task"] == REFUSED
    ]


def server_model(out) -> dict[str, torch.Tensor]:
    return load_checkpoint(Path(out) / "checkpoint.pt")["server"]["model"]


@pytest.fixture(scope="module")
def honest_without_node_two(tmp_path_factory, digits_cache):
    """The reference: the same run where node 2 never answers (a plain failed client)."""
    tmp = tmp_path_factory.mktemp("reference")
    rc = run_config(
        tmp, "silent", digits_cache, rounds=1, failure_policy="resilient", **{"round-timeout": 2.0}
    )
    with pytest.MonkeyPatch.context() as patch:
        _pin_task_identity(patch)
        summary, out = run_on_grid(LocalGrid(rc, silent={100 + FAULTY}), rc)
    assert summary["failed_clients"] == 1
    return server_model(out)


@pytest.fixture
def task_identity(monkeypatch):
    """Messages are created inside a ServerApp process, whose identity Flower sets."""
    _pin_task_identity(monkeypatch)


def _pin_task_identity(patch) -> None:
    from flwr.supercore.task_identity import TaskIdentity

    patch.setattr(TaskIdentity, "_run_id", 1)
    patch.setattr(TaskIdentity, "_node_id", 0)
    patch.setattr(TaskIdentity, "_task_id", 1)


# -- conversion refuses malformed messages ---------------------------------------------------


def test_malformed_reply_records_are_conversion_errors():
    good = to_recorddict(Record(arrays={"model.w": torch.zeros(2)}, metrics={"num-examples": 3}))
    assert from_recorddict(good).metrics == {"num-examples": 3}
    for fault in ("no-arrays", "arrays-as-config"):
        content = to_recorddict(Record(arrays={"model.w": torch.zeros(2)}))
        faults.REPLY_FAULTS[fault](content)
        with pytest.raises(ConversionError, match="arrays"):
            from_recorddict(content)
    extra = to_recorddict(Record())
    extra["payload"] = ConfigRecord({"x": 1})
    with pytest.raises(ConversionError, match="unexpected"):
        from_recorddict(extra)
    twice = to_recorddict(Record(metrics={"n": 1}))
    twice["metrics-other"]["n"] = "1"
    with pytest.raises(ConversionError, match="twice"):
        from_recorddict(twice)
    with pytest.raises(ConversionError, match="missing"):
        from_recorddict(RecordDict())


@pytest.mark.parametrize(
    "identity, problem",
    [
        ({"partition-id": "zero"}, "not an integer"),
        ({"partition-id": [0, 1]}, "not an integer"),
        ({"partition-id": True}, "not an integer"),
        ({"partition-id": 1.0}, "not an integer"),
        ({"partition-id": 3, "num-partitions": 3}, "outside"),
        ({"partition-id": -1}, "outside"),
        ({"partition-id": 0, "num-partitions": "3"}, "not an integer"),
        ({"client-id": "1"}, "not an integer"),
        ({"client-id": 7}, "not a client"),
    ],
)
def test_bad_identities_are_config_errors(identity, problem):
    with pytest.raises(ConfigError, match=problem):
        node_client_id(identity, [0, 1, 2])


# -- the real ServerApp against one hostile node, in process --------------------------------


@pytest.mark.parametrize("fault", sorted(faults.REPLY_FAULTS))
def test_tampered_reply_is_a_failed_client(
    fault, tmp_path, digits_cache, task_identity, honest_without_node_two, caplog
):
    rc = run_config(tmp_path, fault, digits_cache, rounds=1, failure_policy="resilient")
    grid = LocalGrid(rc, node_config={FAULTY: {"fault": fault}}, app=faults.app)
    summary, out = run_on_grid(grid, rc)
    assert summary["failed_clients"] == 1, fault
    failures = [r.getMessage() for r in caplog.records if "failed task" in r.getMessage()]
    assert len(failures) == 1 and f"client {FAULTY} failed task" in failures[0], failures
    assert "\n" not in failures[0]
    model = server_model(out)
    for key, reference in honest_without_node_two.items():
        assert model[key].dtype == reference.dtype, key
        assert torch.equal(model[key], reference), f"{fault} changed {key}"
    assert all(math.isfinite(h["train_loss"]) for h in read_history(out))


@pytest.mark.parametrize("fault", sorted(faults.IDENTITY_FAULTS))
def test_false_identity_is_refused_on_server_and_node(
    fault, tmp_path, digits_cache, task_identity, caplog, capfd
):
    rc = run_config(tmp_path, fault, digits_cache, rounds=1, **{"connect-timeout": 0.0})
    grid = LocalGrid(rc, node_config={FAULTY: {"fault": fault}}, app=faults.app)
    summary, _ = run_on_grid(grid, rc)
    assert summary["failed_clients"] == 1  # client 2 has no node; the run goes on
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert any(f"node {100 + FAULTY} refused" in m and "not an integer" in m for m in refusals)
    assert refused_nodes(grid) == [100 + FAULTY]
    assert "the ServerApp refused this SuperNode" in capfd.readouterr().err


def test_second_claim_of_a_client_is_refused(tmp_path, digits_cache, task_identity, caplog):
    """Node 3 claims partition 1, already served by node 1: refused, never used, and
    the run equals the honest three-node run."""
    rc = run_config(tmp_path, "claim", digits_cache, rounds=2)
    grid = LocalGrid(rc, nodes=4, node_config={3: {"partition-id": 1}})
    for context in grid.contexts.values():
        context.node_config["num-partitions"] = 3
    summary, out = run_on_grid(grid, rc)
    assert summary["failed_clients"] == 0
    messages = [r.getMessage() for r in caplog.records]
    assert any("node 103 refused" in m and "already served by node 101" in m for m in messages)
    assert refused_nodes(grid) == [103]
    trained = {n for n, c in grid.contexts.items() if "fedshift.state.tree" in c.state}
    assert 103 not in trained
    honest = LocalGrid(rc)
    _, reference = run_on_grid(honest, {**rc, "out-dir": str(tmp_path / "honest")})
    for key, value in server_model(reference).items():
        assert torch.equal(server_model(out)[key], value), key


class RestartingGrid(LocalGrid):
    """Node 101 goes offline after round 1 and node 103 (same partition) comes online."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lookups = 0

    def get_node_ids(self):
        self.lookups += 1
        return [100, 101, 102] if self.lookups == 1 else [100, 102, 103]


def test_restarted_node_takes_over_after_the_holder_went_offline(
    tmp_path, digits_cache, task_identity, caplog
):
    rc = run_config(tmp_path, "restart", digits_cache, rounds=2)
    grid = RestartingGrid(rc, nodes=4, node_config={3: {"partition-id": 1}})
    for context in grid.contexts.values():
        context.node_config["num-partitions"] = 3
    summary, _ = run_on_grid(grid, rc)
    assert summary["failed_clients"] == 0
    messages = [r.getMessage() for r in caplog.records]
    assert any("client 1 is now served by node 103 (node 101 went offline)" in m for m in messages)
    assert not refused_nodes(grid)


# -- real SuperNodes on loopback --------------------------------------------------------------

#: the twelve reply faults, six rounds, two hostile nodes (one fault each per round)
REPLY_CYCLES = (sorted(faults.REPLY_FAULTS)[0::2], sorted(faults.REPLY_FAULTS)[1::2])


@pytest.mark.flower
def test_e2e_hostile_supernodes_never_crash_the_serverapp(tmp_path_factory, digits_cache):
    """Seven SuperNodes, every one running the fault-injecting ClientApp: partition 0 is
    honest, partitions 1 and 2 send the twelve tampered replies over the wire (one each
    per round, six rounds), two nodes answer the identity query with ``"zero"`` and a
    list, and one more claims partition 0 a second time. The run completes; each tampered
    reply is one failed client with a one-line reason; every false identity and the
    second claim are refused, on the server and in the node's own log; the global model
    stays float32 and finite."""
    if not shutil.which(flower_bin("flower-superlink")):
        pytest.skip("flower-superlink is not on PATH")
    from fedshift.data import load_dataset

    load_dataset("digits-dg", cache_dir=digits_cache)
    cluster = Cluster(tmp_path_factory.mktemp("hostile"), digits_cache)
    three = "num-partitions=3"
    configs = [
        f"partition-id=0 {three}",
        f"partition-id=1 {three} fault='{','.join(REPLY_CYCLES[0])}'",
        f"partition-id=2 {three} fault='{','.join(REPLY_CYCLES[1])}'",
        f"partition-id=1 {three} fault='partition-id-string'",
        f"partition-id=2 {three} fault='partition-id-list'",
        f"partition-id=0 {three}",  # a second claim of client 0
    ]
    try:
        cluster.start(node_configs=configs, clientapp="fedshift.engine.flower.faults:app")
        rounds = len(REPLY_CYCLES[0])
        out = cluster.root / "out"
        settings = e2e_settings(
            out, rounds=rounds, failure_policy="resilient", **{"connect-timeout": 20.0}
        )
        wait_run(cluster.submit("hostile", settings), timeout=600)
    finally:
        cluster.stop_all()
    logs = cluster.root / "logs"
    assert (out / "summary.json").is_file(), f"the ServerApp crashed; see {logs}"
    history = read_history(out)
    assert [h["failed_clients"] for h in history] == [2] * rounds
    run_log = (logs / "run-hostile.log").read_text()
    failures = [line for line in run_log.splitlines() if "failed task 'train'" in line]
    for round_, (one, two) in enumerate(zip(*REPLY_CYCLES, strict=True), start=1):
        got = [line for line in failures if f"round {round_}: client" in line]
        assert len(got) == 2, (round_, one, two, got)
    refused = [line for line in run_log.splitlines() if "refused:" in line]
    assert sum("not an integer" in line for line in refused) == 2, refused
    assert sum("already served" in line for line in refused) == 1, refused
    node_logs = [(logs / f"node{i}.log").read_text() for i in range(len(configs))]
    told = [i for i, text in enumerate(node_logs) if "the ServerApp refused this SuperNode" in text]
    assert {3, 4} <= set(told) and len(told) == 3, told
    model = load_checkpoint(out / "checkpoint.pt")["server"]["model"]
    for key, value in model.items():
        if value.is_floating_point() or key.endswith(("weight", "bias")):
            assert value.dtype == torch.float32 and bool(torch.isfinite(value).all()), key
    summary = json.loads((out / "summary.json").read_text())
    assert math.isfinite(summary["target_accuracy"])
    print(f"\nseconds per round with hostile nodes: {[h['seconds'] for h in history]}")


def test_evaluate_replies_are_checked():
    from fedshift.engine.flower.federation import score_problem

    needed = {"val", "test"}
    good = Record(metrics={"val": 0.5, "test": 1, "domain.mnist": 0.25})
    assert score_problem(good, needed, True) is None
    for metrics, problem in [
        ({"val": "x", "test": 0.5}, "not a number"),
        ({"val": 2.0, "test": 0.5}, "not a number in"),
        ({"val": float("nan"), "test": 0.5}, "not a number in"),
        ({"val": True, "test": 0.5}, "not a number"),
        ({"val": 0.5}, "missing"),
    ]:
        assert problem in score_problem(Record(metrics=metrics), needed, False), metrics
    assert "per-domain" in score_problem(Record(metrics={"val": 0.1, "test": 0.2}), needed, True)
    assert "arrays" in score_problem(Record(arrays={"w": torch.zeros(1)}), needed, False)


# -- a reply whose .npy header announces a huge array (issue 23, item 2) ----------------------

#: float32 of this shape: 373 GiB announced by a header of about 128 bytes
HUGE_SHAPE = (100_000, 1_000_000)


def huge_array() -> Array:
    """A Flower ``Array`` that is only a ``.npy`` header announcing :data:`HUGE_SHAPE`."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": "<f4", "fortran_order": False, "shape": HUGE_SHAPE}
    )
    return Array(dtype="float32", shape=HUGE_SHAPE, stype="numpy.ndarray", data=header.getvalue())


def huge_header_app(message, context):
    """The real ClientApp; node ``FAULTY`` puts a huge-array header in its train replies."""
    reply = clientapp.handle(message, context)
    control = dict(message.content[CONTROL]) if CONTROL in message.content else {}
    hostile = context.node_config["partition-id"] == FAULTY and control.get("call", -1) != -1
    if hostile and "arrays" in reply.content and reply.content["arrays"]:
        arrays = reply.content["arrays"]
        arrays[next(iter(arrays.keys()))] = huge_array()
    return reply


def test_huge_npy_header_is_a_failed_client_and_the_run_goes_on(
    tmp_path, digits_cache, task_identity, caplog
):
    rc = run_config(tmp_path, "huge", digits_cache, rounds=2, failure_policy="resilient")
    summary, out = run_on_grid(LocalGrid(rc, app=huge_header_app), rc)
    assert summary["failed_clients"] == 2  # client 2 in each round; the run completed
    failures = [r.getMessage() for r in caplog.records if "failed task" in r.getMessage()]
    assert len(failures) == 2, failures
    for line in failures:
        assert f"client {FAULTY} failed task 'train'" in line and "\n" not in line, line
        assert "announces float32[100000, 1000000]" in line, line
    assert all(math.isfinite(h["train_loss"]) for h in read_history(out))


def test_huge_npy_header_under_the_strict_policy_fails_the_serverapp_cleanly(
    tmp_path, digits_cache, task_identity, caplog
):
    """Under ``strict`` the run stops with RoundFailed (no MemoryError); the ServerApp
    says so in one line naming the run directory and raises it, so Flower marks the run
    failed; the run directory holds no summary.json."""
    rc = run_config(tmp_path, "huge-strict", digits_cache, rounds=1, failure_policy="strict")
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=rc)
    with pytest.raises(RoundFailed, match="failure_policy=strict"):
        serverapp.main(LocalGrid(rc, app=huge_header_app), context)
    failed = [r.getMessage() for r in caplog.records if "fedshift run FAILED" in r.getMessage()]
    assert len(failed) == 1 and "RoundFailed: round 1" in failed[0], failed
    assert rc["out-dir"] in failed[0] and "\n" not in failed[0]
    assert not (Path(rc["out-dir"]) / "summary.json").exists()


def test_announced_arrays_are_checked_against_the_schema_before_loading(monkeypatch):
    """A reply whose headers break the task's reply schema is refused before any array is
    loaded; so is a header whose size disagrees with its bytes."""
    from fedshift.core.schema import ArraySpec
    from fedshift.engine.flower import convert

    def never(array):
        raise AssertionError("an array was loaded before the checks")

    schema = {"model.w": ArraySpec((2,), torch.float32)}
    wrong = to_recorddict(Record(arrays={"model.w": torch.zeros(3)}, metrics={"num-examples": 1}))
    monkeypatch.setattr(convert, "array_to_tensor", never)
    with pytest.raises(ConversionError, match=r"reply schema: 'model.w' has shape \(3,\)"):
        from_recorddict(wrong, schema=schema)
    content = to_recorddict(Record(metrics={"num-examples": 1}))
    content["arrays"]["model.w"] = huge_array()
    with pytest.raises(ConversionError, match="announces float32"):
        from_recorddict(content, schema=schema)
    truncated = to_recorddict(Record(arrays={"model.w": torch.zeros(2)}))
    array = truncated["arrays"]["model.w"]
    truncated["arrays"]["model.w"] = Array(
        dtype=array.dtype, shape=array.shape, stype=array.stype, data=array.data[:-1]
    )
    with pytest.raises(ConversionError, match="but 7 data bytes follow"):
        from_recorddict(truncated, schema=schema)
