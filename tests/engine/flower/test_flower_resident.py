"""The resident worker: same numbers as the simulation, falls back and restarts, refuses
malformed frames, and (loopback Flower) serves each SuperNode and leaves with it."""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
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

from fedshift.engine.flower import clientapp  # noqa: E402
from fedshift.engine.flower.serverapp import run_on_grid  # noqa: E402
from fedshift.engine.flower.transport import resident, wire  # noqa: E402


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
        except (ConnectionError, wire.ProtocolError):
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
            wait_until_released(paths.life_lock)
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
    opening = wire.prologue(secret)
    head = json.dumps({"op": "ping"}).encode()
    bad = [
        raw_request(node0.socket, head, header=opening[:4] + b"0" * 64),  # wrong secret
        raw_request(node0.socket, header=opening + b"XXXX\0\0\0\0"),  # wrong magic
        raw_request(node0.socket, header=opening + struct.pack(">4sI", b"FSW1", wire.MAX_JSON + 1)),
        raw_request(node0.socket, b"[1, 2]", header=opening),  # head not an object
        raw_request(  # an object array: pickle, never loaded
            node0.socket,
            json.dumps(
                {"op": "task", "records": {"content": [["a", "array", [["x", "object", [1]]]]]}}
            ).encode(),
            npy(np.array([{"evil": 1}], dtype=object)),
            header=opening,
        ),
        raw_request(  # announced shape differs from the bytes
            node0.socket,
            json.dumps(
                {"op": "task", "records": {"content": [["a", "array", [["x", "float32", [3]]]]]}}
            ).encode(),
            npy(np.zeros(2, dtype=np.float32)),
            header=opening,
        ),
    ]
    assert all(answer.get("ok") is not True for answer in bad)
    after = raw_request(node0.socket, head, header=opening)
    assert after["ok"] is True and after["pid"] == status["pid"] and after["rejected"] == len(bad)
    err = capfd.readouterr().err
    assert len(re.findall(r"rejected a request: ", err)) == len(bad), err
    assert "wrong secret" in err and "dtype 'object' is not allowed" in err, err
    assert "holds float32[2], announced float32[3]" in err, err


def wait_until_released(life_lock: Path) -> None:
    """Until no process holds the worker's life lock: a killed worker's socket and lock go
    with its last thread, which may still be exiting after its main thread shows as a
    zombie (seen beside a busy xdist worker: the ClientApp then reached the dying worker's
    socket, got a broken pipe, and a second fallback followed)."""
    deadline = time.monotonic() + 60
    with open(life_lock, "a") as life:
        while True:
            try:
                fcntl.flock(life, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                assert time.monotonic() < deadline, f"{life_lock} still held 60 s after the kill"
                time.sleep(0.05)
                continue
            fcntl.flock(life, fcntl.LOCK_UN)
            return


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


# -- the worker under hostile requests: it refuses each one and keeps serving -----------------

#: the whole-request deadline of the worker these tests start (seconds)
DEADLINE = 3.0


@pytest.fixture(scope="module")
def lone_worker(tmp_path_factory):
    """One worker started by hand (watching this process), with a short request deadline;
    its stderr goes to a file. Yields (process, paths, log file)."""
    folder = Path(tempfile.mkdtemp(prefix="fsw-"))
    node_config = {"partition-id": 0, "num-partitions": 3, "worker-dir": str(folder)}
    log = tmp_path_factory.mktemp("lone-worker") / "worker.log"
    command = [
        sys.executable,
        "-m",
        "fedshift.engine.flower.transport.worker",
        "--node-config-json",
        json.dumps(node_config),
        "--supernode-pid",
        str(os.getpid()),
        "--idle-timeout",
        "0",
        "--request-deadline",
        str(DEADLINE),
    ]
    with open(log, "w") as err:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err
        )
    paths = resident.worker_paths(node_config, os.getpid())
    deadline = time.monotonic() + 180
    while True:
        try:
            resident.ping(paths)
            break
        except (OSError, wire.ProtocolError, resident.WorkerUnavailable):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    yield process, paths, log
    process.terminate()
    process.wait(timeout=30)


def frame(payload: bytes) -> bytes:
    return wire.HEADER.pack(wire.MAGIC, len(payload)) + payload


def task_head(**records) -> bytes:
    head = {"op": "task", "run_id": 1, "node_id": 1, "run_config": {}, "node_config": {}}
    return json.dumps({**head, "records": records}).encode()


def huge_npy_header() -> bytes:
    """A ``.npy`` header (about 128 bytes) announcing a float32 array of 373 GiB."""
    import io

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": "<f4", "fortran_order": False, "shape": (100_000, 1_000_000)}
    )
    return buffer.getvalue()


def deep(depth: int) -> str:
    return "[" * depth + "1" + "]" * depth


def hostile_request(name: str, secret: str) -> bytes:
    """The bytes of one hostile request (those named "without the secret" never had it)."""
    opening = wire.prologue(secret)
    huge = [["x", "float32", [100_000, 1_000_000]]]
    control = ["fedshift", "config", [["task", "train"], ["timeout", "abc"]]]
    if name == "deep JSON head without the secret":
        return frame(b"[" * 200_000 + b"]" * 200_000)
    if name == "huge .npy header without the secret":
        return frame(task_head(content=[["a", "array", huge]])) + frame(huge_npy_header())
    if name == "timeout='abc' with the secret":
        return opening + frame(task_head(content=[control], state=[]))
    if name == "900-deep config value with the secret":
        value = json.loads(deep(900))  # built and dumped iteratively by json up to 1000 deep
        items = [["task", "train"], ["x", value]]
        return opening + frame(task_head(content=[["fedshift", "config", items]], state=[]))
    if name == "deep JSON head with the secret":
        return opening + frame(b"[" * 200_000 + b"]" * 200_000)
    if name == "huge .npy header with the secret":
        head = task_head(content=[["a", "array", [["x", "float32", [2]]]]], state=[])
        return opening + frame(head) + frame(huge_npy_header())
    raise KeyError(name)


#: each hostile request and the reason the worker must give for refusing it
HOSTILE = {
    "deep JSON head without the secret": "wrong secret",
    "huge .npy header without the secret": "wrong secret",
    "timeout='abc' with the secret": "timeout 'abc' is not a number of seconds",
    "900-deep config value with the secret": "deep, beyond the limit of 64",
    "deep JSON head with the secret": "JSON nested 200000 deep, beyond the limit of 64",
    "huge .npy header with the secret": "announces float32[100000, 1000000]",
}


def send_raw(path: Path, data: bytes, timeout: float = 20.0) -> dict:
    """Send ``data`` to the worker; its answer head ({} when it only hung up). Raises
    TimeoutError when the worker neither answers nor hangs up within ``timeout``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused after the prologue: the rest was never read
        try:
            head, _ = wire.recv_message(sock)
        except (ConnectionError, wire.ProtocolError):
            return {}
        return head


def assert_still_serving(process, paths, log: Path, reason: str) -> None:
    """The same worker process answers a ping, and its log names ``reason`` in one line."""
    assert process.poll() is None, f"the worker died: {log.read_text()[-2000:]}"
    status = resident.ping(paths)
    assert status["pid"] == process.pid
    lines = [line for line in log.read_text().splitlines() if "rejected a request: " in line]
    assert any(reason in line for line in lines), lines[-5:]


@pytest.mark.parametrize("name", list(HOSTILE))
def test_worker_refuses_hostile_request_and_keeps_serving(name, lone_worker):
    process, paths, log = lone_worker
    secret = paths.secret.read_text().strip()
    answer = send_raw(paths.socket, hostile_request(name, secret))
    assert answer.get("ok") is not True
    if answer:
        assert answer["kind"] == "protocol" and HOSTILE[name] in answer["error"], answer
    assert_still_serving(process, paths, log, HOSTILE[name])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_worker_refuses_a_1_gib_frame_without_the_secret_unread(lone_worker):
    """A head without the secret announcing one 1 GiB array, then that frame's header but
    no body: the worker refuses after the 68-byte prologue, without waiting for (or making
    room for) the body, and its memory does not grow."""
    process, paths, log = lone_worker
    before = rss_mib(process.pid)
    head = json.dumps(
        {"op": "task", "records": {"content": [["a", "array", [["x", "uint8", [1 << 30]]]]]}}
    ).encode()
    started = time.monotonic()
    answer = send_raw(paths.socket, frame(head) + wire.HEADER.pack(wire.MAGIC, (1 << 30) + 128))
    assert time.monotonic() - started < DEADLINE, "the worker waited for the body"
    assert answer.get("ok") is not True
    assert rss_mib(process.pid) - before < 64
    assert_still_serving(process, paths, log, "wrong secret")


def test_worker_drops_a_slow_sender_by_the_deadline_and_serves_the_next(lone_worker):
    """A sender with the secret trickles its head one byte every 0.5 s (each recv would be
    quick, the whole would take 50 s): the worker drops it once the request deadline has
    passed and answers the next request."""
    process, paths, log = lone_worker
    secret = paths.secret.read_text().strip()
    head = task_head(content=[], state=[])[:100]
    dropped = {}

    def trickle():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(60)
            sock.connect(str(paths.socket))
            started = time.monotonic()
            try:
                sock.sendall(wire.prologue(secret) + wire.HEADER.pack(wire.MAGIC, len(head)))
                for byte in head:
                    sock.sendall(bytes([byte]))
                    time.sleep(0.5)
            except OSError:
                pass
            try:
                while sock.recv(4096):
                    pass
            except OSError:
                pass
            dropped["after"] = time.monotonic() - started

    sender = threading.Thread(target=trickle)
    sender.start()
    time.sleep(0.3)  # the worker is now busy with the slow sender
    started = time.monotonic()
    status = resident.ping(paths)
    waited = time.monotonic() - started
    sender.join(timeout=120)
    assert status["pid"] == process.pid
    assert waited < DEADLINE + 3, f"the next request waited {waited:.1f} s"
    assert dropped["after"] < DEADLINE + 3, dropped
    assert_still_serving(process, paths, log, "not complete by its deadline")


def test_the_worker_socket_appears_only_once_it_listens(worker_dir, monkeypatch):
    """A ClientApp that finds the socket finds it accepting: the worker listens on a
    private name and renames it into place (before, a connection between bind and listen
    was refused and taken for a dead worker: a second fallback under load)."""
    from fedshift.engine.flower.transport.worker import Worker

    node = {"worker-dir": str(worker_dir), "resident-worker": True}
    worker = Worker(node, os.getpid(), idle_timeout=0)
    worker.paths.socket.write_text("a killed worker's socket")
    seen: list[bool] = []
    listen = socket.socket.listen

    def watched(sock, *args):
        seen.append(worker.paths.socket.is_socket())
        return listen(sock, *args)

    monkeypatch.setattr(socket.socket, "listen", watched)
    worker._listen()
    try:
        assert seen == [False]
        assert worker.paths.socket.is_socket()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(worker.paths.socket))
        assert [p.name for p in worker_dir.iterdir() if p.name.startswith(".")] == []
    finally:
        worker.listener.close()
        worker.paths.socket.unlink()


def test_a_ping_is_answered_while_a_slow_sender_holds_a_connection(lone_worker):
    """#34: one slow request never holds the worker. A sender with the secret trickles its
    head one byte every 0.5 s; a ping sent meanwhile is answered at once (it used to wait
    until the trickling request was dropped at the deadline)."""
    process, paths, _ = lone_worker
    secret = paths.secret.read_text().strip()
    head = task_head(content=[], state=[])[:100]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as slow:
        slow.settimeout(60)
        slow.connect(str(paths.socket))
        slow.sendall(wire.prologue(secret) + wire.HEADER.pack(wire.MAGIC, len(head)) + head[:3])
        time.sleep(0.3)  # the worker is now reading the slow request
        started = time.monotonic()
        status = resident.ping(paths)
        waited = time.monotonic() - started
    assert status["pid"] == process.pid
    assert waited < 1.0, f"the ping waited {waited:.1f} s behind the slow sender"


def test_a_16_mib_head_of_escaped_quotes_is_refused_at_once_and_delays_no_ping(lone_worker):
    """#34: the JSON depth check was quadratic in a head of escaped quotes (80 kB: 30 s; the
    16 MiB the worker reads would take days); now the largest head is refused as "not JSON"
    within seconds, and a ping sent while it is read is answered at once."""
    process, paths, log = lone_worker
    secret = paths.secret.read_text().strip()
    data = wire.prologue(secret) + frame(b'\\"' * (wire.MAX_JSON // 2))
    answers = {}

    def hostile():
        started = time.monotonic()
        answers["head"] = send_raw(paths.socket, data)
        answers["seconds"] = time.monotonic() - started

    sender = threading.Thread(target=hostile)
    sender.start()
    started = time.monotonic()
    status = resident.ping(paths)
    waited = time.monotonic() - started
    sender.join(timeout=60)
    assert status["pid"] == process.pid and waited < 1.0, f"the ping waited {waited:.1f} s"
    assert answers["head"]["kind"] == "protocol" and "not JSON" in answers["head"]["error"]
    assert answers["seconds"] < 3.0, answers["seconds"]
    assert_still_serving(process, paths, log, "not JSON")
