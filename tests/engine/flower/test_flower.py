"""Flower engine: pickle-free conversion, ClientApp dispatch, and real deployments.

In-process tests drive the real ServerApp code (``run_on_grid``) and the real ClientApp
object through a small in-memory grid; ``flower``-marked tests start a SuperLink and three
SuperNodes on 127.0.0.1 and submit runs with ``flwr run``.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest
import torch
from helpers import read_history

pytest.importorskip("flwr", reason="flwr is not installed; pip install -e '.[flower]'")

from flwr.app import ArrayRecord, Context, Message, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedshift.algorithms import REGISTRY  # noqa: E402
from fedshift.core.algorithm import Algorithm, client_task  # noqa: E402
from fedshift.core.errors import (
    CheckpointError,  # noqa: E402
    ConfigError,  # noqa: E402
    RoundFailed,  # noqa: E402
)
from fedshift.core.hparams import NoHparams  # noqa: E402
from fedshift.core.record import Kind, Record  # noqa: E402
from fedshift.core.reduce import weighted_mean  # noqa: E402
from fedshift.core.runconfig import RUN_KEYS  # noqa: E402
from fedshift.core.schema import family
from fedshift.core.state import load_checkpoint  # noqa: E402
from fedshift.engine.flower import clientapp  # noqa: E402
from fedshift.engine.flower.convert import (  # noqa: E402
    ConversionError,
    from_recorddict,
    load_state,
    save_state,
    tensor_to_array,
    to_recorddict,
)
from fedshift.engine.flower.messages import CONTROL  # noqa: E402
from fedshift.engine.flower.serverapp import run_on_grid  # noqa: E402
from fedshift.engine.flower.settings import (  # noqa: E402
    DEPLOY_DEFAULTS,
    load_run_dataset,
    node_client_id,
    parse_run_config,
)
from fedshift.engine.flower.transport.node_state import NodeSnapshots  # noqa: E402
from fedshift.engine.run.runner import run_experiment  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
APP_DIR = REPO / "deploy" / "flower"
ACCURACY_KEYS = ("target_accuracy", "target_accuracy_last", "source_val_accuracy")


# -- conversion ------------------------------------------------------------------------------


def test_record_round_trip_keeps_values_dtypes_and_shapes():
    arrays = {
        "model.conv.weight": torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 7,
        "model.bn.num_batches_tracked": torch.tensor(5),  # 0-d int64 buffer
        "model.t": torch.arange(6, dtype=torch.float64).reshape(2, 3).t(),  # non-contiguous
        "prototype.3": torch.tensor([0.5, -1.25], dtype=torch.float16),
        "count.mask": torch.tensor([True, False]),
        "style.u8": torch.tensor([0, 255], dtype=torch.uint8),
    }
    record = Record(
        arrays=arrays,
        config={"lr": 0.1, "steps": 3, "mode": "fast", "flag": True},
        metrics={"loss": 1.0 / 3.0, "num-examples": 96, "domain": "mnist", "ok": False},
    )
    content = to_recorddict(record, {"task": "train", "round": 2, "call": 0})
    back = from_recorddict(content, with_control=True)
    assert list(back.arrays) == list(arrays)
    for key, tensor in arrays.items():
        assert back.arrays[key].dtype == tensor.dtype, key
        assert back.arrays[key].shape == tensor.shape, key
        assert torch.equal(back.arrays[key], tensor), key
    assert back.config == record.config
    assert back.metrics == record.metrics
    assert {k: type(v) for k, v in back.metrics.items()} == {
        k: type(v) for k, v in record.metrics.items()
    }
    assert dict(content[CONTROL]) == {"task": "train", "round": 2, "call": 0}
    assert isinstance(content["arrays"], ArrayRecord)


def test_converted_tensors_do_not_share_memory():
    tensor = torch.zeros(3)
    back = from_recorddict(to_recorddict(Record(arrays={"model.w": tensor})))
    back.arrays["model.w"] += 1
    assert float(tensor.sum()) == 0.0


def test_client_state_round_trip():
    state = {
        "prev_model": {"w": torch.tensor([[1.0, 2.0]]), "n": torch.tensor(3)},
        7: [torch.zeros(2, dtype=torch.int32), 4, 0.25, None, "text", True],
        "pair": (1.5, torch.ones(1)),
        "nan": float("nan"),
        "inf": float("-inf"),
    }
    holder = RecordDict()
    save_state(state, holder)
    back = load_state(holder)
    assert set(back) == set(state)
    assert torch.equal(back["prev_model"]["w"], state["prev_model"]["w"])
    assert back["prev_model"]["n"].shape == ()
    assert torch.equal(back[7][0], state[7][0]) and back[7][0].dtype == torch.int32
    assert back[7][1:] == [4, 0.25, None, "text", True]
    assert isinstance(back["pair"], tuple) and back["pair"][0] == 1.5
    assert math.isnan(back["nan"]) and back["inf"] == float("-inf")
    assert load_state(RecordDict()) == {}


def test_conversion_refuses_what_needs_pickle():
    with pytest.raises(ConversionError, match="bfloat16"):
        to_recorddict(Record(arrays={"model.w": torch.zeros(2, dtype=torch.bfloat16)}))
    with pytest.raises(ConversionError, match="unsupported type"):
        save_state({"fn": object()}, RecordDict())


# -- configuration ---------------------------------------------------------------------------


def test_run_config_parsing_and_node_identity(tmp_path):
    cfg, opts = parse_run_config(
        {
            "algorithm": "fedprox",
            "rounds": 4,
            "algo.mu": 0.5,
            "set": "seed=3 local_epochs=2",
            "round-timeout": 30.0,
            "max-samples": 16,
        }
    )
    assert (cfg.algorithm, cfg.rounds, cfg.seed, cfg.local_epochs) == ("fedprox", 4, 3, 2)
    assert cfg.algo["mu"] == 0.5
    assert opts.round_timeout == 30.0 and opts.max_samples == 16 and not opts.resume
    with pytest.raises(ConfigError, match="unknown run config key"):
        parse_run_config({"num-server-rounds": 3})
    with pytest.raises(ConfigError, match="round-timeout"):
        parse_run_config({"round-timeout": 0})
    (tmp_path / "config.json").write_text("{}")  # a run that was not started on Flower
    with pytest.raises(CheckpointError, match="Flower token"):
        run_on_grid(None, {"resume": True, "out-dir": str(tmp_path)})  # before any message

    ids = [0, 1, 2]
    assert node_client_id({"partition-id": 2, "num-partitions": 3}, ids) == 2
    assert node_client_id({"client-id": 1}, ids) == 1
    with pytest.raises(ConfigError, match="num-partitions"):
        node_client_id({"partition-id": 0, "num-partitions": 4}, ids)
    with pytest.raises(ConfigError, match="partition-id"):
        node_client_id({}, ids)


def test_deploy_app_points_at_fedshift_components():
    project = tomllib.loads((APP_DIR / "pyproject.toml").read_text())
    app = project["tool"]["flwr"]["app"]
    assert "federations" not in project["tool"]["flwr"], "1.41 rewrites pyproject if present"
    for ref in app["components"].values():
        module, attr = ref.split(":")
        __import__(module)
        assert getattr(sys.modules[module], attr) is not None
    config = app["config"]
    assert set(config) <= set(RUN_KEYS) | set(DEPLOY_DEFAULTS)
    assert set(DEPLOY_DEFAULTS) <= set(config)
    parse_run_config(config)
    # nothing but the app's own config would be packed into the FAB
    shipped = [p.name for p in APP_DIR.rglob("*") if p.suffix in (".py", ".toml", ".md", ".json")]
    assert shipped == ["pyproject.toml"]


# -- in-process grid: the real ServerApp and ClientApp code without processes ----------------


class LocalGrid:
    """The two ``Grid`` methods FlowerFederation uses, answered by the real ClientApp.

    Each node has its own Flower ``Context`` (its ``state`` persists between messages, as
    on a SuperNode). ``silent`` nodes say who they are but never answer a task (a timeout);
    ``corrupt`` nodes answer with NaN arrays; ``crash_in_round`` makes the grid raise (a
    dying ServerApp). Client-state snapshots go to ``node-state`` next to the run directory.
    """

    def __init__(
        self,
        run_config,
        nodes=3,
        *,
        silent=(),
        corrupt=(),
        crash_in_round=None,
        node_config=None,
        app=None,
    ):
        state_dir = str(Path(run_config["out-dir"]).parent / "node-state")  # the nodes' disks
        node_config = node_config or {}
        self.contexts = {
            100 + i: Context(
                run_id=1,
                node_id=100 + i,
                node_config={
                    "partition-id": i,
                    "num-partitions": nodes,
                    "state-dir": state_dir,
                    **node_config.get(i, {}),
                },
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for i in range(nodes)
        }
        self.app = app or clientapp.app
        self.silent, self.corrupt = set(silent), set(corrupt)
        self.crash_in_round = crash_in_round
        self.ids = itertools.count()
        self.pushed: list[tuple[int, Message]] = []
        self.replies: dict[str, Message] = {}
        self.pulls = 0

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        """Deliver each message to its node's ClientApp at once; keep the replies."""
        ids = []
        for message in messages:
            if message.metadata.group_id == str(self.crash_in_round):
                raise ConnectionError("ServerApp lost its SuperLink")
            message_id = f"m{next(self.ids)}"
            message.metadata.__dict__["_message_id"] = message_id
            ids.append(message_id)
            node = message.metadata.dst_node_id
            self.pushed.append((node, message))
            if node in self.silent and message.metadata.message_type == "train":
                continue
            reply = self.app(message, self.contexts[node])
            if node in self.corrupt and "arrays" in reply.content:
                for key, array in list(reply.content["arrays"].items()):
                    nan = torch.full(tuple(array.shape), float("nan"))
                    reply.content["arrays"][key] = tensor_to_array(key, nan)
            self.replies[message_id] = reply
        return ids

    def pull_messages(self, message_ids):
        self.pulls += 1
        return [self.replies.pop(m) for m in message_ids if m in self.replies]


@pytest.fixture
def task_identity(monkeypatch):
    """Messages are created inside a ServerApp process, whose identity Flower sets."""
    monkeypatch.setattr(TaskIdentity, "_run_id", 1)
    monkeypatch.setattr(TaskIdentity, "_node_id", 0)
    monkeypatch.setattr(TaskIdentity, "_task_id", 1)


def run_config(tmp_path, name, digits_cache, **extra):
    return {
        "algorithm": "fedavg",
        "target": "optdigits",
        "rounds": 3,
        "batch_size": 32,
        "device": "cpu",
        "max-samples": 48,
        "cache-dir": digits_cache,
        "round-timeout": 60.0,
        "out-dir": str(tmp_path / name),
        **extra,
    }


def simulate(rc, out):
    """The same run on the in-process simulation engine."""
    cfg, opts = parse_run_config(rc)
    summary, _ = run_experiment(cfg, out, progress=False, dataset=load_run_dataset(cfg, opts))
    return summary


def assert_same_models(dir_a, dir_b):
    a = load_checkpoint(Path(dir_a) / "checkpoint.pt")["server"]
    b = load_checkpoint(Path(dir_b) / "checkpoint.pt")["server"]
    assert a["model"].keys() == b["model"].keys()
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key


def test_flower_engine_equals_simulation_in_process(tmp_path, digits_cache, task_identity):
    rc = run_config(tmp_path, "flower", digits_cache)
    grid = LocalGrid(rc)
    summary, out = run_on_grid(grid, rc)
    expected = simulate(rc, tmp_path / "sim")
    for key in (*ACCURACY_KEYS, "per_domain_accuracy", "bytes_up", "bytes_down"):
        assert summary[key] == expected[key], key
    assert summary["failed_clients"] == 0
    assert [h["train_loss"] for h in read_history(out)] == [
        h["train_loss"] for h in read_history(tmp_path / "sim")
    ]
    assert_same_models(out, tmp_path / "sim")
    for name in ("config.json", "metrics.jsonl", "summary.json", "checkpoint.pt"):
        assert (Path(out) / name).is_file(), name


#: the classic baselines with server state (moments, control variates, drift sums) or
#: per-client state (control variates, gradient histories): one short run each
SERVER_STATE_BASELINES = [
    "fedavgm",
    "fedadagrad",
    "fedadam",
    "fedyogi",
    "scaffold",
    "feddyn",
    "fednova",
]


def assert_same_tensors(a, b, where=""):
    """Nested dicts of tensors equal bit for bit (the server's ``extra``)."""
    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same_tensors(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


@pytest.mark.parametrize("algorithm", SERVER_STATE_BASELINES)
def test_server_optimizers_and_drift_correction_equal_simulation(
    tmp_path, digits_cache, task_identity, algorithm
):
    """Two rounds on the in-process grid equal the simulation: numbers, model and the
    server's own state (moments, control variate, drift sum) bit for bit."""
    rc = run_config(tmp_path, algorithm, digits_cache, algorithm=algorithm, rounds=2)
    summary, out = run_on_grid(LocalGrid(rc), rc)
    expected = simulate(rc, tmp_path / "sim")
    for key in (*ACCURACY_KEYS, "per_domain_accuracy", "bytes_up", "bytes_down"):
        assert summary[key] == expected[key], key
    assert summary["failed_clients"] == 0
    assert [h["train_loss"] for h in read_history(out)] == [
        h["train_loss"] for h in read_history(tmp_path / "sim")
    ]
    assert_same_models(out, tmp_path / "sim")
    ours = load_checkpoint(Path(out) / "checkpoint.pt")["server"]["extra"]
    theirs = load_checkpoint(tmp_path / "sim" / "checkpoint.pt")["server"]["extra"]
    assert_same_tensors(ours, theirs)


def test_an_in_process_clientapp_never_interrupts_its_host(
    tmp_path, digits_cache, task_identity, monkeypatch
):
    """The ClientApp's round-timeout watchdog ends a per-message ClientApp process with
    SIGINT; called inside a long-lived process (this in-process grid) it must not fire,
    however long a task takes beyond the round timeout (before, on a busy machine it
    interrupted pytest: RunInterrupted)."""
    monkeypatch.setattr(clientapp, "GRACE", 0.0)
    rc = run_config(tmp_path, "flower", digits_cache, rounds=1, **{"round-timeout": 0.01})
    summary, _ = run_on_grid(LocalGrid(rc), rc)
    assert summary["failed_clients"] == 0


class OvertakingGrid(LocalGrid):
    """Hands over one reply per pull, each pushed message's neighbour first (positions
    1, 0, 3, 2, ...), and logs every pull and every folded reply in ``events``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.position: dict[str, int] = {}
        self.events: list[str] = []

    def push_messages(self, messages):
        ids = super().push_messages(messages)
        self.position.update({m: i for i, m in enumerate(ids)})
        return ids

    def pull_messages(self, message_ids):
        self.pulls += 1
        ready = [m for m in message_ids if m in self.replies]
        if not ready:
            return []
        first = min(ready, key=lambda m: self.position[m] ^ 1)
        self.events.append(f"pull {self.position[first]}")
        return [self.replies.pop(first)]


def test_flower_folds_replies_in_client_order_as_they_arrive(
    tmp_path, digits_cache, task_identity, monkeypatch
):
    """Replies that overtake each other are folded into the mean in client order, each as
    soon as those before it are in (before, every reply was held to the end), and the run
    still equals the simulation bit for bit."""
    from fedshift.algorithms import toolkit

    rc = run_config(tmp_path, "flower", digits_cache, rounds=1)
    grid = OvertakingGrid(rc)
    fold = toolkit.MeanFold.__call__

    def logged(self, cid, reply):
        grid.events.append(f"fold {cid}")
        fold(self, cid, reply)

    monkeypatch.setattr(toolkit.MeanFold, "__call__", logged)
    summary, out = run_on_grid(grid, rc)
    train = grid.events[grid.events.index("fold 0") - 2 :][:6]
    assert train == ["pull 1", "pull 0", "fold 0", "fold 1", "pull 2", "fold 2"]
    expected = simulate(rc, tmp_path / "sim")
    for key in (*ACCURACY_KEYS, "bytes_up", "bytes_down"):
        assert summary[key] == expected[key], key
    assert_same_models(out, tmp_path / "sim")


def test_resume_after_serverapp_crash(tmp_path, digits_cache, task_identity):
    rc = run_config(tmp_path, "crashed", digits_cache)
    with pytest.raises(ConnectionError):
        run_on_grid(LocalGrid(rc, crash_in_round=2), rc)
    assert len(read_history(tmp_path / "crashed")) == 1
    # a new `flwr run` with resume=true: new Flower contexts, same run directory
    summary, _ = run_on_grid(LocalGrid(rc), {**rc, "resume": True})
    uninterrupted = simulate(rc, tmp_path / "sim")
    for key in ACCURACY_KEYS:
        assert summary[key] == uninterrupted[key], key
    assert [h["round"] for h in read_history(tmp_path / "crashed")] == [1, 2, 3]
    assert_same_models(tmp_path / "crashed", tmp_path / "sim")


def test_resumed_run_restores_client_state_from_node_snapshots(
    tmp_path, digits_cache, task_identity
):
    """MOON keeps each client's previous local model in ctx.state: after a ServerApp crash
    the new Flower contexts are empty and the nodes' snapshots must bring it back."""
    rc = run_config(tmp_path, "moon", digits_cache, algorithm="moon")
    with pytest.raises(ConnectionError):
        run_on_grid(LocalGrid(rc, crash_in_round=3), rc)
    saved = tmp_path / "moon-saved"
    shutil.copytree(tmp_path / "moon", saved)
    summary, _ = run_on_grid(LocalGrid(rc), {**rc, "resume": True})
    uninterrupted = simulate(rc, tmp_path / "sim")
    for key in ACCURACY_KEYS:
        assert summary[key] == uninterrupted[key], key
    assert_same_models(tmp_path / "moon", tmp_path / "sim")
    # without the snapshots the resumed round starts from empty client states and differs
    shutil.rmtree(tmp_path / "node-state")
    shutil.rmtree(tmp_path / "moon")
    saved.rename(tmp_path / "moon")
    forgetful, _ = run_on_grid(LocalGrid(rc), {**rc, "resume": True})
    assert (
        read_history(tmp_path / "moon")[-1]["train_loss"]
        != read_history(tmp_path / "sim")[-1]["train_loss"]
    )
    assert forgetful["bytes_up"] == uninterrupted["bytes_up"]


def test_node_snapshots_keep_the_newest_rounds(tmp_path):
    snaps = NodeSnapshots(tmp_path, "0123abcd", 4)
    assert snaps.latest_before(5) == {}
    for round_ in (1, 2, 4):
        snaps.save(round_, {"round": round_, "w": torch.full((2,), float(round_))})
    assert snaps.rounds() == [2, 4]
    assert snaps.latest_before(4)["round"] == 2  # round 4 was in progress: ignored
    assert torch.equal(snaps.latest_before(9)["w"], torch.full((2,), 4.0))
    with pytest.raises(ValueError, match="run token"):
        NodeSnapshots(tmp_path, "../escape", 0)


@pytest.mark.parametrize("algorithm", ["fedproto", "ditto"])
def test_personal_models_are_scored_on_their_nodes(
    tmp_path, digits_cache, task_identity, algorithm
):
    """FedProto (prototypes on the wire, personal models) and Ditto (global model plus kept
    personal models): the nodes score the personal models, equal to the simulation."""
    rc = run_config(tmp_path, algorithm, digits_cache, algorithm=algorithm, rounds=2)
    summary, out = run_on_grid(LocalGrid(rc), rc)
    expected = simulate(rc, tmp_path / "sim")
    keys = ("personalized_accuracy", "personalized_accuracy_std", *ACCURACY_KEYS)
    for key in (*keys, "per_domain_accuracy", "bytes_up", "bytes_down"):
        assert summary[key] == expected[key], key
    assert [h["train_loss"] for h in read_history(out)] == [
        h["train_loss"] for h in read_history(tmp_path / "sim")
    ]
    if algorithm == "fedproto":
        # 3 clients x 2 rounds x <= 10 prototypes of 256 floats (+ counts); one model: 2.6 MB
        assert summary["bytes_up"] <= 3 * 2 * 10 * (256 * 4 + 8)


class SlowStartGrid(LocalGrid):
    """Answers each identity query only ``delay`` seconds after it was pushed, as a
    SuperNode on a busy machine does while it starts the ClientApp process that answers;
    counts the identity queries each node was sent."""

    def __init__(self, *args, delay: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.delay = delay
        self.ready_at: dict[str, float] = {}
        self.queries: dict[int, int] = {}

    def push_messages(self, messages):
        messages = list(messages)
        ids = super().push_messages(messages)
        for message_id, message in zip(ids, messages, strict=True):
            if message.metadata.message_type == "query":
                node = message.metadata.dst_node_id
                self.queries[node] = self.queries.get(node, 0) + 1
                self.ready_at[message_id] = time.monotonic() + self.delay
        return ids

    def pull_messages(self, message_ids):
        now = time.monotonic()
        ready = [m for m in message_ids if self.ready_at.get(m, 0.0) <= now]
        return super().pull_messages(ready)


def test_identity_answers_slower_than_the_round_timeout_are_taken(
    tmp_path, digits_cache, task_identity, monkeypatch
):
    """Each node answers its identity query 2.5 s after it was sent, longer than the
    1-s round timeout: every node is asked once and identified, and the run equals the
    simulation. Before, each retry asked again and waited 1 s for the new query only, so
    no node was ever identified and the run failed ("no SuperNode serves clients")."""
    monkeypatch.setattr(clientapp, "GRACE", 600.0)  # in process: no watchdog on the tasks
    rc = run_config(
        tmp_path, "slow", digits_cache, rounds=1, **{"round-timeout": 1.0, "connect-timeout": 20.0}
    )
    grid = SlowStartGrid(rc, delay=2.5)
    summary, out = run_on_grid(grid, rc)
    assert grid.queries == {100: 1, 101: 1, 102: 1}
    assert summary["failed_clients"] == 0
    expected = simulate(rc, tmp_path / "sim")
    for key in (*ACCURACY_KEYS, "bytes_up", "bytes_down"):
        assert summary[key] == expected[key], key
    assert_same_models(out, tmp_path / "sim")


def test_silent_and_corrupt_clients_fail_under_policy(tmp_path, digits_cache, task_identity):
    rc = run_config(tmp_path, "dyn", digits_cache, rounds=2, **{"round-timeout": 5.0})
    summary, out = run_on_grid(LocalGrid(rc, silent={101}, corrupt={102}), rc)
    assert summary["failed_clients"] == 4  # two clients in each of two rounds
    assert [h["failed_clients"] for h in read_history(out)] == [2, 2]
    assert math.isfinite(summary["target_accuracy"])

    quick = {"round-timeout": 5.0}  # a silent client is waited for this long
    strict = run_config(tmp_path, "strict", digits_cache, failure_policy="strict", **quick)
    with pytest.raises(RoundFailed, match="strict"):
        run_on_grid(LocalGrid(strict, silent={101}), strict)
    needs_two = run_config(tmp_path, "min2", digits_cache, min_clients=2, **quick)
    with pytest.raises(RoundFailed, match="min_clients=2"):
        run_on_grid(LocalGrid(needs_two, silent={101, 102}), needs_two)


class PrototypeExchange(Algorithm):
    """Test algorithm whose messages are not model weights: per-class feature means.

    Each client sends the mean embedding of each class it holds (PROTOTYPE) and counts
    its calls in a nested ``ctx.state``; the server keeps the weighted mean per class.
    """

    name = "test-prototypes"
    paper = "test double"
    Hparams = NoHparams
    shares = {"prototype": Kind.PROTOTYPE, "count": Kind.COUNT}

    def round(self, state, fed):
        replies = fed.call("prototypes", fed.sample(), Record(config={"scale": 1.0}))
        table = {}
        for cls in range(self.run.num_classes):
            key = f"prototype.{cls}"
            have = [r for r in replies.values() if key in r.arrays]
            if have:
                weights = [float(r.arrays[f"count.{cls}"]) for r in have]
                table[str(cls)] = weighted_mean([{"p": r.arrays[key]} for r in have], weights)["p"]
        state.extra["prototypes"] = table
        calls = [r.metrics["calls"] for r in replies.values()]
        return state, {"train_loss": 0.0, "client_calls": float(sum(calls))}

    def reply_schema(self, task, sent):
        return {**family("prototype", (None,), torch.float32), **family("count", (), torch.int64)}

    @client_task("prototypes")
    def prototypes(self, ctx, record):
        model = ctx.build_model().to(ctx.device).eval()
        sums, counts = {}, {}
        with torch.no_grad():
            for x, y in ctx.train.batches(16, ctx.rng):
                feats = model.features(x)
                for cls in y.unique().tolist():
                    pick = feats[y == cls]
                    sums[cls] = sums.get(cls, 0) + pick.sum(0)
                    counts[cls] = counts.get(cls, 0) + len(pick)
        history_ = ctx.state.setdefault("history", {"calls": 0, "rounds": []})
        history_["calls"] += 1
        history_["rounds"].append(torch.tensor(ctx.round))
        reply = Record(metrics={"calls": history_["calls"], "num-examples": len(ctx.train)})
        for cls, total in sums.items():
            reply.arrays[f"prototype.{cls}"] = total / counts[cls]
            reply.arrays[f"count.{cls}"] = torch.tensor(counts[cls])
        return reply


def test_non_model_messages_and_client_state(tmp_path, digits_cache, task_identity, monkeypatch):
    monkeypatch.setitem(REGISTRY, PrototypeExchange.name, PrototypeExchange)
    rc = run_config(tmp_path, "protos", digits_cache, algorithm=PrototypeExchange.name)
    grid = LocalGrid(rc)
    run_on_grid(grid, rc)
    simulate(rc, tmp_path / "sim")
    flower = load_checkpoint(tmp_path / "protos" / "checkpoint.pt")["server"]["extra"]
    sim = load_checkpoint(tmp_path / "sim" / "checkpoint.pt")["server"]["extra"]
    assert flower["prototypes"].keys() == sim["prototypes"].keys() and sim["prototypes"]
    for cls, proto in sim["prototypes"].items():
        assert torch.equal(flower["prototypes"][cls], proto), cls
    # ctx.state lived in Flower's Context.state between messages: 3 calls per client
    assert [h["client_calls"] for h in read_history(tmp_path / "protos")] == [3.0, 6.0, 9.0]
    for context in grid.contexts.values():
        state = load_state(context.state)
        assert state["history"]["calls"] == 3
        assert [int(t) for t in state["history"]["rounds"]] == [1, 2, 3]


def test_client_task_message_reaching_wrong_node_is_refused(task_identity, digits_cache):
    rc = {"target": "optdigits", "device": "cpu", "max-samples": 16, "cache-dir": digits_cache}
    context = Context(1, 5, {"partition-id": 0}, RecordDict(), rc)
    record = to_recorddict(Record(), {"task": "train", "client": 2, "round": 1, "call": 0})
    message = Message(record, dst_node_id=5, message_type="train")
    with pytest.raises(RuntimeError, match="reached the node serving client 0"):
        clientapp.app(message, context)


# -- real Flower processes -------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def flower_bin(name: str) -> str:
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


def stop(proc: subprocess.Popen, timeout: float = 15.0) -> None:
    """SIGTERM the process (a SuperNode then unregisters), then SIGKILL its own group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # leftovers of the group this test started
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(timeout=timeout)


class Cluster:
    """A SuperLink and three SuperNodes on loopback, each in its own process group."""

    def __init__(self, root: Path, cache: str):
        self.root = root
        self.env = {
            **os.environ,
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "FEDSHIFT_CACHE": cache,
            # Flower starts flower-superexec / flwr-clientapp by name: use this venv's
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        }
        self.port = free_port()
        self.procs: list[subprocess.Popen] = []
        self.nodes: list[subprocess.Popen] = []
        (root / "logs").mkdir(parents=True)

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        env = {**self.env, "FLWR_HOME": str(self.root / f"home-{name}")}
        log = open(self.root / "logs" / f"{name}.log", "w")  # noqa: SIM115 - closed with proc
        proc = subprocess.Popen(
            args, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.procs.append(proc)
        return proc

    def start(
        self, nodes: int = 3, node_configs: list[str] | None = None, clientapp: str = ""
    ) -> None:
        """Start the SuperLink and one SuperNode per node config (default: ``nodes``
        honest partitions); ``clientapp`` replaces the App's ClientApp component."""
        node_configs = node_configs or [
            f"partition-id={i} num-partitions={nodes}" for i in range(nodes)
        ]
        nodes = len(node_configs)
        self.spawn(
            "superlink",
            [
                flower_bin("flower-superlink"),
                "--insecure",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--disable-runtime-dependency-installation",
            ],
        )
        for i, node_config in enumerate(node_configs):
            node = self.spawn(
                f"node{i}",
                [
                    flower_bin("flower-supernode"),
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{self.port}",
                    "--port",
                    str(free_port()),
                    "--node-config",
                    node_config,
                ],
            )
            self.nodes.append(node)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            logs = [(self.root / "logs" / f"node{i}.log").read_text() for i in range(nodes)]
            if all("SuperNode ID" in text for text in logs):
                break
            if any(p.poll() is not None for p in self.procs):
                raise RuntimeError(f"a Flower process exited early; see {self.root / 'logs'}")
            time.sleep(0.5)
        else:
            raise TimeoutError(f"SuperNodes did not register in 120 s; see {self.root / 'logs'}")
        home = self.root / "home-cli"
        home.mkdir()
        (home / "config.toml").write_text(
            '[superlink]\ndefault = "local-deployment"\n\n'
            f'[superlink.local-deployment]\naddress = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        app = self.root / "app"
        app.mkdir()
        project = (APP_DIR / "pyproject.toml").read_text()
        if clientapp:
            default = 'clientapp = "fedshift.engine.flower.clientapp:app"'
            assert default in project
            project = project.replace(default, f'clientapp = "{clientapp}"')
        (app / "pyproject.toml").write_text(project)

    def submit(self, name: str, settings: dict) -> subprocess.Popen:
        """``flwr run`` of the repo's Flower App with ``settings`` as run-config overrides."""
        items = " ".join(
            f"{k}='{v}'"
            if isinstance(v, str)
            else f"{k}={str(v).lower()}"
            if isinstance(v, bool)
            else f"{k}={v}"
            for k, v in settings.items()
        )
        env = {**self.env, "FLWR_HOME": str(self.root / "home-cli")}
        log = open(self.root / "logs" / f"run-{name}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [flower_bin("flwr"), "run", ".", "local-deployment", "--stream"]
            + ["--run-config", items],
            cwd=self.root / "app",
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def stop_run(self, name: str) -> None:
        """``flwr stop`` the run that ``submit(name, ...)`` started (its id is in the log)."""
        log = (self.root / "logs" / f"run-{name}.log").read_text()
        run_id = log.split("Successfully started run ", 1)[1].split()[0]
        env = {**self.env, "FLWR_HOME": str(self.root / "home-cli")}
        subprocess.run(
            [flower_bin("flwr"), "stop", run_id, "local-deployment"],
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            stop(proc)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, digits_cache):
    flwr_cli = Path(flower_bin("flower-superlink"))
    if not (flwr_cli.exists() or shutil.which(str(flwr_cli))):
        pytest.skip("flower-superlink is not on PATH")
    from fedshift.data import load_dataset

    load_dataset("digits-dg", cache_dir=digits_cache)  # built once, before nodes race for it
    cluster = Cluster(tmp_path_factory.mktemp("flower"), digits_cache)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop_all()


def wait_run(proc: subprocess.Popen, timeout: float) -> None:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(proc)
        pytest.fail(f"flwr run did not finish within {timeout} s")


def e2e_settings(out: Path, **extra) -> dict:
    """A small e2e run. One thread everywhere: the nodes and the in-test simulation then
    sum in the same order however many threads an earlier test left this process."""
    return {
        "algorithm": "fedavg",
        "threads": 1,
        "target": "optdigits",
        "rounds": 3,
        "batch_size": 32,
        "device": "cpu",
        "max-samples": 48,
        "round-timeout": 120.0,
        "connect-timeout": 60.0,
        "out-dir": str(out),
        **extra,
    }


@pytest.mark.flower
def test_e2e_fedavg_on_flower_equals_simulation(cluster, tmp_path):
    settings = e2e_settings(cluster.root / "out-fedavg")
    wait_run(cluster.submit("fedavg", settings), timeout=480)
    out = Path(settings["out-dir"])
    assert (out / "summary.json").is_file(), f"run failed; see {cluster.root / 'logs'}"
    summary = json.loads((out / "summary.json").read_text())
    expected = simulate({**settings, "cache-dir": cluster.env["FEDSHIFT_CACHE"]}, tmp_path / "sim")
    assert summary["failed_clients"] == 0
    for key in ACCURACY_KEYS:
        assert summary[key] == pytest.approx(expected[key], abs=1e-6), key
    for got, want in zip(read_history(out), read_history(tmp_path / "sim"), strict=True):
        assert got["train_loss"] == pytest.approx(want["train_loss"], abs=1e-6)
        assert got["per_domain_accuracy"] == want["per_domain_accuracy"]
    assert_same_models(out, tmp_path / "sim")
    flower_s = [h["seconds"] for h in read_history(out)]
    sim_s = [h["seconds"] for h in read_history(tmp_path / "sim")]
    print(f"\nseconds per round: flower {flower_s}, simulation {sim_s}")


def wait_rounds(out: Path, rounds: int, run: subprocess.Popen, cluster: Cluster) -> None:
    """Wait until ``rounds`` rounds are in ``out/metrics.jsonl`` (at most 300 s)."""
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while not metrics.is_file() or len(metrics.read_text().splitlines()) < rounds:
        assert run.poll() is None, f"run ended before round {rounds}; see {cluster.root / 'logs'}"
        assert time.monotonic() < deadline, f"round {rounds} did not finish in 300 s"
        time.sleep(0.2)


def serverapp_pids(superlink: int) -> list[int]:
    """PIDs of the ``flwr-serverapp`` processes below the SuperLink process (its SuperExec
    runs in a session of its own, so the process tree is followed, not the session)."""
    parent: dict[int, int] = {}
    program: dict[int, list[str]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        pid = int(proc.name)
        parent[pid] = int(stat.rsplit(")", 1)[1].split()[1])
        program[pid] = [Path(a.decode(errors="replace")).name for a in argv[:2]]

    def below_superlink(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == superlink:
                return True
        return False

    return [p for p, names in program.items() if "flwr-serverapp" in names and below_superlink(p)]


@pytest.mark.flower
@pytest.mark.slow  # 70-90 s of loopback rounds: kept out of the default tier's time
def test_e2e_fedproto_prototypes_and_personal_models(cluster, tmp_path):
    """Only prototypes cross the wire; the personal models are scored on the SuperNodes."""
    settings = e2e_settings(cluster.root / "out-fedproto", algorithm="fedproto", rounds=2)
    wait_run(cluster.submit("fedproto", settings), timeout=480)
    out = Path(settings["out-dir"])
    assert (out / "summary.json").is_file(), f"run failed; see {cluster.root / 'logs'}"
    summary = json.loads((out / "summary.json").read_text())
    expected = simulate({**settings, "cache-dir": cluster.env["FEDSHIFT_CACHE"]}, tmp_path / "sim")
    assert summary["failed_clients"] == 0
    for key in (*ACCURACY_KEYS, "personalized_accuracy", "personalized_accuracy_std"):
        assert summary[key] == pytest.approx(expected[key], abs=1e-6), key
    assert summary["bytes_up"] == expected["bytes_up"] <= 3 * 2 * 10 * (256 * 4 + 8)


@pytest.mark.flower
@pytest.mark.slow  # 70-90 s of loopback rounds: kept out of the default tier's time
def test_e2e_killed_serverapp_resumes_with_client_states(cluster, tmp_path):
    """SIGKILL the ServerApp process in round 2 of a MOON run (client state: each client's
    previous model), start it again with resume=true: the result equals an uninterrupted
    simulation, so server checkpoint and the nodes' client snapshots were both restored."""
    settings = e2e_settings(cluster.root / "out-resume", algorithm="moon")
    out = Path(settings["out-dir"])
    run = cluster.submit("resume-1", settings)
    wait_rounds(out, 1, run, cluster)
    victims = serverapp_pids(cluster.procs[0].pid)
    assert victims, f"no ServerApp process found; see {cluster.root / 'logs'}"
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    stop(run)  # the streaming `flwr run` of the dead run
    assert len(read_history(out)) == 1
    cluster.stop_run("resume-1")  # as the README says: stop the dead run, then resume
    # the nodes may still be busy with the dead run's last message: wait for them
    resumed = {**settings, "resume": True, "connect-timeout": 240.0}
    wait_run(cluster.submit("resume-2", resumed), timeout=480)
    assert (out / "summary.json").is_file(), f"resumed run failed; see {cluster.root / 'logs'}"
    summary = json.loads((out / "summary.json").read_text())
    expected = simulate({**settings, "cache-dir": cluster.env["FEDSHIFT_CACHE"]}, tmp_path / "sim")
    assert [h["round"] for h in read_history(out)] == [1, 2, 3]
    assert summary["failed_clients"] == 0
    for key in ACCURACY_KEYS:
        assert summary[key] == pytest.approx(expected[key], abs=1e-6), key
    for got, want in zip(read_history(out), read_history(tmp_path / "sim"), strict=True):
        assert got["train_loss"] == pytest.approx(want["train_loss"], abs=1e-6)
    assert_same_models(out, tmp_path / "sim")
    print(f"\nseconds per round, killed and resumed: {[h['seconds'] for h in read_history(out)]}")


@pytest.mark.flower
@pytest.mark.slow  # 70-90 s of loopback rounds: kept out of the default tier's time
def test_e2e_supernode_killed_in_round_two_is_a_failed_client(cluster):
    settings = e2e_settings(cluster.root / "out-kill")
    out = Path(settings["out-dir"])
    run = cluster.submit("kill", settings)
    wait_rounds(out, 1, run, cluster)
    victim = cluster.nodes[2]
    os.killpg(victim.pid, signal.SIGKILL)  # the node and its ClientApp, mid-round 2
    victim.wait(timeout=15)
    wait_run(run, timeout=420)
    assert (out / "summary.json").is_file(), f"run failed; see {cluster.root / 'logs'}"
    summary = json.loads((out / "summary.json").read_text())
    rounds = read_history(out)
    assert [h["round"] for h in rounds] == [1, 2, 3]
    assert rounds[0]["failed_clients"] == 0
    assert rounds[1]["failed_clients"] == 1
    assert summary["failed_clients"] >= 1
    assert math.isfinite(summary["target_accuracy"])
    print(f"\nseconds per round with a killed node: {[h['seconds'] for h in rounds]}")
