"""The resident worker: same numbers as the simulation, falls back and restarts, refuses
malformed frames, and (loopback Flower) serves each SuperNode and leaves with it."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr is not installed; pip install -e '.[flower]'")

from test_flower import (  # noqa: E402
    ACCURACY_KEYS,
    LocalGrid,
    assert_same_models,
    e2e_settings,
    run_config,
    simulate,
    task_identity,  # noqa: F401 - a fixture, used by name
    wait_run,
)

from fedshift.engine.flower import clientapp, resident, wire  # noqa: E402
from fedshift.engine.flower.serverapp import run_on_grid  # noqa: E402


@pytest.fixture
def worker_dir():
    """A short private folder for the sockets (a Unix socket path has ~100 bytes); the
    workers started in it are stopped afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="fsw-"))
    yield folder
    for life in folder.glob("*.pid"):
        text = life.read_text().strip()
        if text.isdigit():
            try:
                os.kill(int(text), signal.SIGTERM)
            except ProcessLookupError:
                pass


def worker_pids(folder: Path) -> dict[str, int]:
    """The pid each live worker in ``folder`` wrote into its life-lock file."""
    pids = {}
    for life in folder.glob("*.pid"):
        text = life.read_text().strip()
        if text.isdigit() and Path(f"/proc/{text}").exists():
            pids[life.stem] = int(text)
    return pids


def raw_request(path: Path, *frames: bytes, header: bytes | None = None) -> dict:
    """Send raw bytes to a worker socket; its answer head (or {} if it only hung up)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(60)
        sock.connect(str(path))
        try:
            if header is not None:
                sock.sendall(header)
            wire.send_frames(sock, frames)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the worker refused what it read so far and hung up: read its answer
        try:
            head, _ = wire.recv_message(sock)
        except ConnectionError:
            return {}
        return head


def npy(array: np.ndarray) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


@pytest.mark.usefixtures("task_identity")
def test_resident_worker_equals_simulation_survives_kill_and_bad_frames(
    tmp_path, digits_cache, worker_dir, capfd
):
    """Three nodes forward their tasks to three workers (the ClientApp runs in this
    process, so each worker watches this process): the run equals the simulation
    bit for bit; a worker SIGKILLed before round 2 makes that node's ClientApp run the
    task itself with one line and start a new worker, which serves round 3; malformed
    frames are refused with one line each and the worker keeps serving."""
    rc = run_config(tmp_path, "flower", digits_cache, threads=1)
    nodes = {i: {"worker-dir": str(worker_dir), "resident-worker": True} for i in range(3)}
    killed = {}

    def app(message, context):
        """The real ClientApp; node 0's worker is killed before its first round-2 task."""
        control = dict(message.content["fedshift"]) if "fedshift" in message.content else {}
        if control.get("round") == 2 and context.node_config["partition-id"] == 0 and not killed:
            paths = resident.worker_paths(context.node_config, os.getpid())
            pid = int(paths.life_lock.read_text())
            os.kill(pid, signal.SIGKILL)
            while Path(f"/proc/{pid}").exists() and "Z" not in proc_state(pid):
                time.sleep(0.05)
            killed["pid"] = pid
        return clientapp.app(message, context)

    grid = LocalGrid(rc, node_config=nodes, app=app)
    summary, out = run_on_grid(grid, rc)
    expected = simulate(rc, tmp_path / "sim")
    for key in (*ACCURACY_KEYS, "per_domain_accuracy", "bytes_up", "bytes_down"):
        assert summary[key] == expected[key], key
    assert_same_models(out, tmp_path / "sim")

    err = capfd.readouterr().err
    fallbacks = [line for line in err.splitlines() if "running the task in the ClientApp" in line]
    assert len(fallbacks) == 1, err
    assert "resident worker failed" in fallbacks[0]
    assert len(re.findall(r"fedshift worker \d+: serving ", err)) == 4, err  # 3 + 1 restart
    pids = worker_pids(worker_dir)
    assert len(pids) == 3 and killed["pid"] not in pids.values()
    node0 = resident.worker_paths(grid.contexts[100].node_config, os.getpid())
    status = resident.ping(node0)
    assert status["pid"] != killed["pid"] and status["tasks"] >= 1  # round 3 ran there

    secret = node0.secret.read_text().strip()
    head = json.dumps({"op": "ping", "secret": secret}).encode()
    bad = [
        raw_request(node0.socket, header=b"XXXX\0\0\0\0"),  # wrong magic
        raw_request(node0.socket, header=struct.pack(">4sI", b"FSW1", wire.MAX_JSON + 1)),
        raw_request(node0.socket, b"[1, 2]"),  # head not an object
        raw_request(node0.socket, json.dumps({"op": "ping", "secret": "0" * 64}).encode()),
        raw_request(  # an object array: pickle, never loaded
            node0.socket,
            json.dumps(
                {
                    "op": "task",
                    "secret": secret,
                    "records": {"content": [["a", "array", [["x", "object", [1]]]]]},
                }
            ).encode(),
            npy(np.array([{"evil": 1}], dtype=object)),
        ),
        raw_request(  # announced shape differs from the bytes
            node0.socket,
            json.dumps(
                {
                    "op": "task",
                    "secret": secret,
                    "records": {"content": [["a", "array", [["x", "float32", [3]]]]]},
                }
            ).encode(),
            npy(np.zeros(2, dtype=np.float32)),
        ),
    ]
    assert all(answer.get("ok") is not True for answer in bad)
    after = raw_request(node0.socket, head)
    assert after["ok"] is True and after["pid"] == status["pid"] and after["rejected"] == len(bad)
    err = capfd.readouterr().err
    assert len(re.findall(r"rejected a request: ", err)) == len(bad), err
    assert "allow_pickle=False" in err and "announced float32[3]" in err, err


def proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_clientapp_process_stays_free_of_torch():
    code = (
        "import sys; import fedshift.engine.flower.clientapp; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.flower
@pytest.mark.slow
def test_e2e_resident_workers_on_loopback(tmp_path_factory, digits_cache, tmp_path):
    """Loopback Flower with resident workers: the same numbers as the simulation, one
    worker per SuperNode and no fallback, and every worker leaves with its SuperNode."""
    from test_flower import Cluster, flower_bin

    if not Path(flower_bin("flower-superlink")).exists():
        pytest.skip("flower-superlink is not installed")
    from fedshift.data import load_dataset

    load_dataset("digits-dg", cache_dir=digits_cache)
    folder = Path(tempfile.mkdtemp(prefix="fsw-"))
    cluster = Cluster(tmp_path_factory.mktemp("resident"), digits_cache)
    try:
        cluster.start(
            node_configs=[
                f"partition-id={i} num-partitions=3 worker-dir='{folder}'" for i in range(3)
            ]
        )
        settings = e2e_settings(cluster.root / "out")
        wait_run(cluster.submit("resident", settings), timeout=480)
        out = Path(settings["out-dir"])
        assert (out / "summary.json").is_file(), f"run failed; see {cluster.root / 'logs'}"
        summary = json.loads((out / "summary.json").read_text())
        expected = simulate(
            {**settings, "cache-dir": cluster.env["FEDSHIFT_CACHE"]}, tmp_path / "sim"
        )
        assert summary["failed_clients"] == 0
        for key in (*ACCURACY_KEYS, "bytes_up", "bytes_down"):
            assert summary[key] == expected[key], key
        assert_same_models(out, tmp_path / "sim")
        logs = [(cluster.root / "logs" / f"node{i}.log").read_text() for i in range(3)]
        for node, text in zip(cluster.nodes, logs, strict=True):
            assert f"for SuperNode pid {node.pid}" in text, text[-3000:]
            assert "running the task in the ClientApp" not in text, text[-3000:]
        workers = worker_pids(folder)
        assert len(workers) == 3
    finally:
        cluster.stop_all()
    deadline = time.monotonic() + 30
    while worker_pids(folder):  # each worker watches its SuperNode
        assert time.monotonic() < deadline, f"workers {worker_pids(folder)} outlived the nodes"
        time.sleep(0.5)
