"""Experiment tracking (run key ``tracking``): what the loggers hold equals metrics.jsonl."""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import struct

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from fedshift.cli import main
from fedshift.config import resolve, resolve_resume
from fedshift.core.errors import ConfigError
from fedshift.engine.assembly import prepare
from fedshift.engine.run import tracking
from fedshift.engine.run.runner import Runner

OPTIONAL = [name for name in ("wandb", "mlflow") if importlib.util.find_spec(name)]


def make_cfg(rounds: int, **overrides):
    settings = {"rounds": rounds, "batch_size": 32, "device": "cpu", "threads": 1, **overrides}
    return resolve(None, {"target": "optdigits"}, [f"{k}={v}" for k, v in settings.items()])


def run(run_dir, dataset, rounds=2, resume=False, stop_after=None, **overrides):
    runner = Runner(
        prepare(make_cfg(rounds, **overrides), dataset=dataset), run_dir, progress=False
    )
    return runner.run(resume=resume, stop_after=stop_after)


def metric_lines(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory, micro_digits):
    """A 2-round run logged by TensorBoard and every optional logger installed."""
    run_dir = tmp_path_factory.mktemp("tracked") / "run"
    summary = run(run_dir, micro_digits, tracking=",".join(["tensorboard", *OPTIONAL]))
    return run_dir, summary


def test_tensorboard_scalars_equal_the_metrics_lines(tracked_run):
    run_dir, summary = tracked_run
    logged = scalars(run_dir)
    lines = metric_lines(run_dir)
    assert [line["round"] for line in lines] == [1, 2]
    expected = {}
    for line in lines:
        for key, value in tracking.numeric(line).items():
            expected.setdefault(key, []).append((line["round"], pytest.approx(value, rel=1e-6)))
    assert "per_domain_accuracy/optdigits" in expected and "train_loss" in expected
    assert {k: v for k, v in logged.items() if not k.startswith("summary/")} == expected
    assert logged["summary/target_accuracy"] == [
        (2, pytest.approx(summary["target_accuracy"], rel=1e-6))
    ]


def test_tensorboard_holds_the_config_as_hparams(tracked_run):
    from tensorboard.plugins.hparams import plugin_data_pb2

    run_dir, _ = tracked_run
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    session = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    hparams = session.session_start_info.hparams
    assert hparams["algorithm"].string_value == "fedavg"
    assert hparams["rounds"].number_value == 2
    assert "algo/lr" not in hparams or hparams["algo/lr"].number_value > 0


def wandb_records(path):
    """The records of a W&B ``.wandb`` file (LevelDB log framing, 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, position, pending = 32768, 7, b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header: padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0 and length == 0:
            break
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            yield wandb_internal_pb2.Record.FromString(pending)
            pending = b""


def test_wandb_offline_run_holds_config_rounds_and_summary(tracked_run):
    pytest.importorskip("wandb")
    run_dir, summary = tracked_run
    (run_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    rows, config, final = {}, {}, {}
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {
                "/".join(i.nested_key) or i.key: json.loads(i.value_json)
                for i in record.history.item
            }
            rows[record.history.step.num] = items
        elif kind == "run":  # the run's start record holds its config
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "summary":
            final.update(
                {"/".join(i.nested_key) or i.key: i.value_json for i in record.summary.update}
            )
    assert config["algorithm"] == "fedavg" and config["tracking"].startswith("tensorboard")
    assert sorted(rows) == [1, 2]
    for line in metric_lines(run_dir):
        row = rows[line["round"]]
        for key, value in tracking.numeric(line).items():
            assert row[key] == pytest.approx(value), key
    assert json.loads(final["summary/target_accuracy"]) == pytest.approx(summary["target_accuracy"])


def test_mlflow_local_store_holds_params_and_metric_history(tracked_run):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    run_dir, summary = tracked_run
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("fedshift")
    (found,) = client.search_runs([experiment.experiment_id])
    assert found.info.status == "FINISHED"
    assert found.data.params["algorithm"] == "fedavg" and found.data.params["rounds"] == "2"
    for key in ("train_loss", "target_accuracy", "per_domain_accuracy/mnist", "bytes_up"):
        history = client.get_metric_history(found.info.run_id, key)
        expected = [(line["round"], tracking.numeric(line)[key]) for line in metric_lines(run_dir)]
        assert [(m.step, m.value) for m in history] == [
            (step, pytest.approx(value)) for step, value in expected
        ]
    assert found.data.metrics["summary/target_accuracy"] == pytest.approx(
        summary["target_accuracy"]
    )


def test_resume_logs_each_round_once(tmp_path, micro_digits):
    """Rounds 1-3 logged, the checkpoint at round 2: the resumed run logs 3 and 4 again.
    TensorBoard (purge_step) keeps one value per step, the resumed one; W&B and MLflow hold
    one run per session, the resumed one from round 3 on."""
    run_dir = tmp_path / "run"
    loggers = ",".join(["tensorboard", *OPTIONAL])
    run(run_dir, micro_digits, rounds=4, stop_after=3, checkpoint_every=2, tracking=loggers)
    assert len(scalars(run_dir)["train_loss"]) == 3
    run(run_dir, micro_digits, rounds=4, resume=True, checkpoint_every=2, tracking=loggers)
    logged = scalars(run_dir)
    lines = metric_lines(run_dir)
    assert [step for step, _ in logged["train_loss"]] == [1, 2, 3, 4]
    assert [value for _, value in logged["train_loss"]] == [
        pytest.approx(line["train_loss"], rel=1e-6) for line in lines
    ]
    if "wandb" in OPTIONAL:
        sessions = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
        steps = [
            sorted(r.history.step.num for r in wandb_records(f) if r.HasField("history"))
            for f in sessions
        ]
        assert sorted(steps) == [[1, 2, 3], [3, 4]]
    if "mlflow" in OPTIONAL:
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
        experiment = client.get_experiment_by_name("fedshift")
        runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time"])
        steps = [
            [m.step for m in client.get_metric_history(r.info.run_id, "train_loss")] for r in runs
        ]
        assert steps == [[1, 2, 3], [3, 4]]
        assert runs[1].data.tags["mlflow.parentRunId"] == runs[0].info.run_id


def test_tracking_may_change_on_resume(tmp_path):
    cfg = make_cfg(2)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    assert resolve_resume(tmp_path, None, {}, ["tracking=none"]).tracking == "none"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("tensorbord", "unknown tracking 'tensorbord' (did you mean 'tensorboard'?)"),
        ("none,wandb", "'none' cannot be combined"),
        ("tensorboard,tensorboard", "names a logger twice"),
        (",", "names no logger"),
    ],
)
def test_bad_tracking_values_are_one_line_errors(value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        make_cfg(1, tracking=value)


def test_a_missing_logger_package_names_the_pip_extra(monkeypatch, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else find_spec(name)
    )
    assert main(["run", "--dry-run", "--set", "tracking=tensorboard,mlflow"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "fedshift: error: tracking 'mlflow' needs the mlflow package, which is not installed: "
        "pip install 'fedshift[mlflow]'"
    ]


def test_none_writes_no_tracking_files(tmp_path, micro_digits):
    run(tmp_path / "run", micro_digits, rounds=1, tracking="none")
    assert not (tmp_path / "run" / "tensorboard").exists()


def test_a_failing_logger_is_warned_about_once_and_the_run_goes_on(
    tmp_path, micro_digits, monkeypatch, caplog
):
    def broken(self, round_, values):
        raise OSError("No space left on device")

    monkeypatch.setattr(tracking.TensorBoardLogger, "log_round", broken)
    with caplog.at_level(logging.WARNING, logger="fedshift.engine.run.tracking"):
        summary = run(tmp_path / "run", micro_digits, rounds=2)
    assert summary["rounds"] == 2 and len(metric_lines(tmp_path / "run")) == 2
    warnings = [r.getMessage() for r in caplog.records if r.name == "fedshift.engine.run.tracking"]
    assert warnings == [
        "tracking: tensorboard failed to log a round (OSError: No space left on device); "
        "it logs nothing more for this run"
    ]
