"""Reply validation (shared by both engines) and fault injection in the simulation engine:
every malformed reply is a failed client with one line, never an error in the server and
never averaged in; the three failure policies do exactly what they say."""

from __future__ import annotations

import logging

import pytest
import torch
from test_contract import make_cfg

from fedshift.core.errors import ConfigError, RoundFailed
from fedshift.core.record import Kind, Record
from fedshift.core.schema import (
    ArraySpec,
    class_names,
    echo,
    family,
    lookup,
    schema_problem,
    specs_of,
)
from fedshift.core.state import load_checkpoint
from fedshift.engine.assembly import prepare
from fedshift.engine.federation import validate_reply
from fedshift.engine.run.runner import Runner
from fedshift.engine.simulation.faults import CORRUPTIONS, parse_faults

SHARES = {"model": Kind.MODEL, "prototype": Kind.PROTOTYPE}
SENT = Record(arrays={"model.w": torch.zeros(2, 3), "model.n": torch.tensor(0)})
SCHEMA = {**echo(SENT, "model"), **family("prototype", (None,), torch.float32)}


def honest(**metrics) -> Record:
    return Record(
        arrays={"model.w": torch.ones(2, 3), "model.n": torch.tensor(4)},
        metrics={"num-examples": 10, "samples": 20, "loss": 0.5, **metrics},
    )


def check(reply, **options) -> str | None:
    return validate_reply(reply, SCHEMA, SHARES, **{"max_value": 1e6, "data_size": 50, **options})


def test_an_honest_reply_passes():
    assert check(honest()) is None
    with_prototypes = honest()
    with_prototypes.arrays["prototype.3"] = torch.ones(8)
    assert check(with_prototypes) is None


def altered(change) -> Record:
    reply = honest()
    change(reply)
    return reply


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda r: r.arrays.pop("model.w"), "'model.w' is missing"),
        (lambda r: r.arrays.update({"model.x": torch.ones(1)}), "'model.x' is not part of"),
        (lambda r: r.arrays.update({"secret.x": torch.ones(1)}), "not declared in shares"),
        (lambda r: r.arrays.update({"model.w": torch.ones(3, 2)}), "shape (3, 2), expected (2, 3)"),
        (lambda r: r.arrays.update({"model.w": torch.ones(2, 3).double()}), "dtype torch.float64"),
        (lambda r: r.arrays.update({"model.w": torch.zeros(2, 3, dtype=torch.int8)}), "int8"),
        (lambda r: r.arrays.update({"model.n": torch.tensor(4.0)}), "dtype torch.float32"),
        (lambda r: r.arrays.update({"prototype.1": torch.ones(8, dtype=torch.int64)}), "int64"),
        (lambda r: r.arrays.update({"model.w": torch.full((2, 3), float("nan"))}), "NaN or Inf"),
        (lambda r: r.arrays.update({"model.w": torch.full((2, 3), float("inf"))}), "NaN or Inf"),
        (lambda r: r.arrays.update({"model.w": torch.full((2, 3), 1e30)}), "max_reply_value"),
        (lambda r: r.arrays.update({"model.w": [1.0, 2.0]}), "not a dense tensor"),
        (lambda r: r.arrays.update({"model.w": torch.ones(2, 3).to_sparse()}), "dense tensor"),
        (lambda r: r.metrics.pop("num-examples"), "'num-examples' is missing"),
        (lambda r: r.metrics.update({"num-examples": -5}), "outside 1..50"),
        (lambda r: r.metrics.update({"num-examples": 0}), "outside 1..50"),
        (lambda r: r.metrics.update({"num-examples": 51}), "outside 1..50"),
        (lambda r: r.metrics.update({"num-examples": 1e308}), "not an integer"),
        (lambda r: r.metrics.update({"num-examples": 12.0}), "not an integer"),
        (lambda r: r.metrics.update({"num-examples": "12"}), "str '12', not a number"),
        (lambda r: r.metrics.update({"num-examples": True}), "not a number"),
        (lambda r: r.metrics.update({"samples": "x"}), "'samples' is str"),
        (lambda r: r.metrics.update({"samples": -1}), "outside 0..50000"),
        (lambda r: r.metrics.update({"samples": 50_001}), "outside 0..50000"),
        (lambda r: r.metrics.update({"loss": float("nan")}), "'loss' is nan"),
        (lambda r: r.metrics.update({"loss": [1]}), "not a number"),
        (lambda r: setattr(r, "metrics", [("num-examples", 3)]), "not a mapping"),
        (lambda r: r.arrays.update({3: torch.ones(1)}), "not a mapping of names"),
    ],
)
def test_each_malformed_reply_has_its_one_line_reason(change, reason):
    problem = check(altered(change))
    assert problem is not None and reason in problem, problem
    assert "\n" not in problem


def test_not_a_record_and_the_limits_are_options():
    assert "not a Record" in check({"model.w": torch.ones(2, 3)})
    assert "not a Record" in check(None)
    huge = altered(lambda r: r.arrays.update({"model.w": torch.full((2, 3), 1e30)}))
    assert check(huge, max_value=0.0) is None  # 0: no bound on values
    assert (
        check(altered(lambda r: r.metrics.update({"num-examples": 10**9})), data_size=None) is None
    )


def test_schema_families_and_open_dimensions():
    schema = {"features": ArraySpec((None, 4), torch.float32), **family("count", (), torch.int64)}
    assert lookup(schema, "count.3").required is False
    assert lookup(schema, "features").open and not lookup(schema, "count.3").open
    assert schema_problem({"features": torch.zeros(7, 4)}, schema) is None
    assert "expected (*, 4)" in schema_problem({"features": torch.zeros(7, 5)}, schema)
    assert "missing" in schema_problem({}, schema)
    assert specs_of({"w": torch.zeros(2)}, "model") == {"model.w": ArraySpec((2,), torch.float32)}


def test_paired_class_families_need_valid_and_matching_members():
    classes = class_names(3)
    schema = {
        **family("prototype", (None,), torch.float32, names=classes),
        **family("count", (), torch.int64, names=classes, same_names_as="prototype"),
    }
    proto, count = torch.zeros(4), torch.tensor(5)
    assert schema_problem({"prototype.0": proto, "count.0": count}, schema) is None
    assert schema_problem({}, schema) is None
    assert "'1' is in one only" in schema_problem(
        {"prototype.0": proto, "prototype.1": proto, "count.0": count}, schema
    )
    assert "'0' is in one only" in schema_problem({"count.0": count}, schema)
    assert "'extra' is not a member" in schema_problem({"prototype.extra": proto}, schema)
    assert "'3' is not a member" in schema_problem({"prototype.3": proto, "count.3": count}, schema)


def test_fault_specs_parse_and_refuse_bad_entries():
    faults = parse_faults("raise@2:1, nan@*:0,drop@3:*")
    assert [(f.kind, f.round, f.client) for f in faults] == [
        ("raise", 2, 1),
        ("nan", None, 0),
        ("drop", 3, None),
    ]
    for bad in ("boom@1:1", "nan@1", "nan", "nan@x:1"):
        with pytest.raises(ConfigError, match="faults entry"):
            parse_faults(bad)
    with pytest.raises(ConfigError, match="'shape' is now called 'wrong-shape'"):
        parse_faults("shape@1:1")


# -- fault injection through real runs --------------------------------------------------------


def run(tmp_path, name, dataset, algorithm="fedavg", *, rounds=2, **overrides):
    exp = prepare(make_cfg(algorithm, rounds=rounds, **overrides), dataset=dataset)
    runner = Runner(exp, tmp_path / name, progress=False)
    return runner.run(), runner


def server_model(runner) -> dict[str, torch.Tensor]:
    return load_checkpoint(runner.checkpoint_path)["server"]["model"]


def same_models(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_every_corruption_is_exactly_a_dropped_client(tmp_path, micro_digits, caplog):
    """``resilient``: a corrupted reply of client 1 in round 1 leaves exactly the model of
    the run where client 1's reply was lost (the survivors' weighted mean)."""
    _, dropped = run(
        tmp_path, "drop", micro_digits, rounds=1, failure_policy="resilient", faults="drop@1:1"
    )
    reference = server_model(dropped)
    for kind in ["raise", "straggle", *CORRUPTIONS]:
        caplog.clear()
        summary, runner = run(
            tmp_path, kind, micro_digits, rounds=1, failure_policy="resilient", faults=f"{kind}@1:1"
        )
        assert summary["failed_clients"] == 1, kind
        assert same_models(server_model(runner), reference), kind
        lines = [r.getMessage() for r in caplog.records if "client 1 failed" in r.getMessage()]
        assert len(lines) == 1 and "\n" not in lines[0], (kind, lines)


def test_a_client_that_raises_is_failed_under_every_policy(tmp_path, micro_digits):
    for policy in ("resilient", "dynamic"):
        summary, _ = run(tmp_path, policy, micro_digits, failure_policy=policy, faults="raise@2:0")
        assert summary["failed_clients"] == 1


def test_strict_stops_and_keeps_server_and_client_states(tmp_path, micro_digits):
    """Ditto keeps a personal model per client: a strict failure in round 2 leaves the
    checkpoint of round 1 and the clients' states as they were after round 1."""
    _, clean = run(tmp_path, "clean", micro_digits, "ditto", rounds=1, failure_policy="strict")
    exp = prepare(
        make_cfg("ditto", rounds=2, failure_policy="strict", faults="raise@2:1"),
        dataset=micro_digits,
    )
    runner = Runner(exp, tmp_path / "strict", progress=False)
    with pytest.raises(RoundFailed, match=r"round 2.*clients 1;.*resume"):
        runner.run()
    saved = load_checkpoint(runner.checkpoint_path)
    assert saved["round"] == 1
    assert same_models(saved["server"]["model"], server_model(clean))
    for cid, ctx in runner.exp.contexts.items():
        kept = saved["clients"][str(cid)]
        assert ctx.state.keys() == kept.keys()
        for key, value in kept.items():
            if isinstance(value, dict):
                assert same_models(ctx.state[key], value), (cid, key)


def test_dynamic_passes_at_min_clients_and_fails_one_below(tmp_path, micro_digits):
    summary, _ = run(
        tmp_path, "ok", micro_digits, failure_policy="dynamic", min_clients=2, faults="nan@2:0"
    )
    assert summary["failed_clients"] == 1
    with pytest.raises(RoundFailed, match="only 1 of 3 clients replied"):
        run(
            tmp_path,
            "below",
            micro_digits,
            failure_policy="dynamic",
            min_clients=2,
            faults="nan@2:0,drop@2:2",
        )


def test_min_clients_above_the_sampled_clients_is_a_config_error(tmp_path, micro_digits):
    with pytest.raises(ConfigError, match="min_clients=4 but only 3"):
        run(tmp_path, "x", micro_digits, min_clients=4)


def test_a_stragglers_late_reply_never_reaches_a_later_round(tmp_path, micro_digits, caplog):
    caplog.set_level(logging.WARNING)
    _, late = run(tmp_path, "late", micro_digits, failure_policy="resilient", faults="straggle@1:2")
    _, lost = run(tmp_path, "lost", micro_digits, failure_policy="resilient", faults="drop@1:2")
    assert same_models(server_model(late), server_model(lost))
    assert any("arrived late; discarded" in r.getMessage() for r in caplog.records)
