"""The ClientApp's side of the resident worker: find it, start it, forward a task to it.

Flower 1.41 starts a new ClientApp process for every message, so each task would pay the
torch import and the task build again. With ``resident-worker`` on (node config; by
default on for a ClientApp below a SuperNode) the ClientApp stays thin: it never imports
torch, and forwards the task message's content and the node's ``Context.state`` over a
Unix socket to one long-running ``python -m fedshift.engine.flower.transport.worker`` per
SuperNode, which keeps torch, the dataset and the built experiment loaded and runs the
task with the same code (:func:`fedshift.engine.flower.clientapp.answer`). The reply and
the new state come back the same way, so Flower's ``Context.state`` stays the one source
of client state and a worker restart changes nothing.

The first ClientApp on a node starts the worker (detached, watching the SuperNode's pid
and an idle timeout) and waits for it; a lock file lets only one start at a time and the
worker itself holds a second lock for its whole life, so two never serve one node. The
socket lives in a directory only this user may enter (mode 0700, checked), and every
request opens with the worker's secret, read from a mode 0600 file there, in a fixed-size
prologue the worker checks before it reads anything else (:mod:`.wire`). If the worker is
unusable, gone or breaks the protocol, the ClientApp logs one line and runs the task in
its own process (today's path); a dead worker is restarted for the next message.

Kept free of torch: this module is imported by every ClientApp process.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import stat
import string
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flwr.app import Context, RecordDict

from fedshift.engine.flower.messages import identity_of
from fedshift.engine.flower.transport.wire import (
    ProtocolError,
    finite_or_none,
    recv_message,
    send_message,
)

#: node config keys of the resident worker
RESIDENT_KEY = "resident-worker"  # true / false / "auto" (default: on below a SuperNode)
DIR_KEY = "worker-dir"  # where the socket lives; default <tmp>/fedshift-worker-<uid>
IDLE_KEY = "worker-idle-timeout"  # seconds without a task before the worker exits
DEFAULT_IDLE = 600.0
#: seconds a ClientApp waits for a worker it started to answer
START_TIMEOUT = 120.0
#: seconds to connect to a worker (it accepts one request at a time)
CONNECT_TIMEOUT = 30.0
#: a Unix socket path must fit in sun_path (108 bytes on Linux, with its NUL)
MAX_SOCKET_PATH = 100
#: the largest worker secret file read (the secret is 64 hex digits)
MAX_SECRET_BYTES = 256


class WorkerUnavailable(RuntimeError):
    """The resident worker cannot be used for this message (one line, says why)."""


class WorkerTaskError(RuntimeError):
    """The task itself failed in the worker; it would fail in process too."""


def log(text: str) -> None:
    """One line on the SuperNode's log (a ClientApp's stderr is the SuperNode's)."""
    print(f"fedshift: {text}", file=sys.stderr, flush=True)


def enabled(node_config: Mapping[str, Any]) -> bool:
    """Whether this ClientApp forwards its tasks to the node's worker.

    ``resident-worker`` true or false decides; unset (or ``"auto"``), the worker is used
    when this ClientApp is a per-message process below a SuperNode (or a SuperExec),
    the case it exists for, and not when the ClientApp is called inside a long-lived
    process (an in-process grid in tests), where nothing is left to save.
    """
    value = node_config.get(RESIDENT_KEY, "auto")
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return supernode_pid() != os.getpid()
        return text not in ("false", "0", "no", "off")
    return bool(value)


def idle_timeout(node_config: Mapping[str, Any]) -> float:
    """The node config's idle timeout in seconds (0 or less: never exit when idle)."""
    if IDLE_KEY not in node_config:
        return DEFAULT_IDLE
    return finite_or_none(node_config[IDLE_KEY]) or 0.0


@dataclass(frozen=True)
class WorkerPaths:
    """The files of one node's worker: socket, secret, start lock and life lock."""

    socket: Path
    secret: Path
    start_lock: Path
    life_lock: Path


def worker_paths(node_config: Mapping[str, Any], owner: int) -> WorkerPaths:
    """The worker files of the SuperNode process ``owner`` with this node config, in a
    checked private dir.

    One worker serves one SuperNode process (its pid and identity name the files, so a
    restarted SuperNode gets a worker started with its own environment); the directory
    must be a real directory owned by this user that no one else may enter, so only this
    user can reach the socket.
    """
    folder = Path(
        str(node_config.get(DIR_KEY, ""))
        or Path(tempfile.gettempdir()) / f"fedshift-worker-{os.getuid()}"
    )
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.lstat()
    except OSError as exc:
        raise WorkerUnavailable(f"worker dir {folder}: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise WorkerUnavailable(f"worker dir {folder} is not a directory owned by this user")
    if info.st_mode & 0o077:
        raise WorkerUnavailable(
            f"worker dir {folder} is open to other users (mode {stat.S_IMODE(info.st_mode):o})"
        )
    identity = json.dumps([owner, identity_of(node_config)], sort_keys=True, default=str)
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    sock = folder / f"{key}.sock"
    if len(str(sock)) > MAX_SOCKET_PATH:
        raise WorkerUnavailable(f"socket path {sock} is longer than {MAX_SOCKET_PATH} bytes")
    return WorkerPaths(
        socket=sock,
        secret=folder / f"{key}.secret",
        start_lock=folder / f"{key}.start.lock",
        life_lock=folder / f"{key}.pid",
    )


def _program_names(pid: int) -> list[str]:
    """The base names of a process's first two argv items ("python", "flower-supernode")."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2]
    except OSError:
        return []
    return [os.path.basename(a.decode(errors="replace")) for a in argv]


def _parent_of(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def supernode_pid() -> int:
    """The process the worker lives alongside: the ``flower-supernode`` above this
    ClientApp, else the ``flower-superexec`` (``--isolation process``), else this
    process (the ClientApp called in process, as in tests)."""
    superexec = 0
    pid = os.getppid()
    while pid > 1:
        names = _program_names(pid)
        if "flower-supernode" in names:
            return pid
        if "flower-superexec" in names and not superexec:
            superexec = pid
        pid = _parent_of(pid)
    return superexec or os.getpid()


def read_secret(path: Path) -> str:
    """The worker secret in ``path`` (read up to :data:`MAX_SECRET_BYTES`):
    FileNotFoundError when there is none, WorkerUnavailable when it is not a hex token."""
    with open(path, "rb") as handle:
        raw = handle.read(MAX_SECRET_BYTES + 1)
    secret = raw.decode("ascii", "replace").strip()
    if len(raw) > MAX_SECRET_BYTES or not secret or secret.strip(string.hexdigits):
        raise WorkerUnavailable(f"the worker secret {path} is not a hex token")
    return secret


def _connect(paths: WorkerPaths) -> tuple[socket.socket, str]:
    """A connection to the worker and its secret; FileNotFoundError when none runs."""
    if not paths.socket.exists():
        raise FileNotFoundError(f"no worker socket {paths.socket}")
    try:
        secret = read_secret(paths.secret)
    except FileNotFoundError:
        raise  # the worker left (idle) between the two checks: none runs
    except OSError as exc:
        raise WorkerUnavailable(f"cannot read the worker secret ({exc.strerror})") from None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(CONNECT_TIMEOUT)
    try:
        sock.connect(str(paths.socket))
    except OSError:
        sock.close()
        raise
    return sock, secret


def ping(paths: WorkerPaths) -> dict[str, Any]:
    """The worker's status (``pid``, ``tasks`` served); raises when it does not answer."""
    sock, secret = _connect(paths)
    with sock:
        send_message(sock, {"op": "ping"}, {}, secret=secret)
        head, _ = recv_message(sock)
    if head.get("ok") is not True:
        raise WorkerUnavailable(f"worker refused the ping: {head.get('error', '?')}")
    return head


def start_worker(
    node_config: Mapping[str, Any], paths: WorkerPaths, owner: int, *, wait: bool
) -> None:
    """Start this node's worker, detached; with ``wait``, until it answers a ping.

    The start lock lets one ClientApp start it at a time; one that got the lock after
    another started the worker finds it answering and starts nothing.
    """
    with open(paths.start_lock, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if wait:
            try:
                ping(paths)
                return
            except (OSError, ProtocolError, WorkerUnavailable):
                pass
        command = [
            sys.executable,
            "-m",
            "fedshift.engine.flower.transport.worker",
            "--node-config-json",
            json.dumps(dict(node_config), default=str),
            "--supernode-pid",
            str(owner),
            "--idle-timeout",
            str(idle_timeout(node_config)),
        ]
        worker = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # not stopped with the ClientApp's process group
        )
        if not wait:
            return
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            # code 0: another worker, started a moment ago, holds the node; wait for it
            if worker.poll() not in (None, 0):
                raise WorkerUnavailable(f"the worker exited with code {worker.returncode}")
            try:
                ping(paths)
                return
            except (OSError, ProtocolError, WorkerUnavailable):
                time.sleep(0.1)
        raise WorkerUnavailable(f"the worker did not answer within {START_TIMEOUT:g} s")


def restart_worker(node_config: Mapping[str, Any], paths: WorkerPaths, owner: int) -> None:
    """Start a new worker, without waiting, if no worker process holds the node.

    A killed worker leaves its socket behind; it is removed here (only when the life lock
    is free, so never a live worker's), so the next message waits for the new worker
    instead of finding the dead socket again.
    """
    with open(paths.life_lock, "a") as life:
        try:
            fcntl.flock(life, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return  # a worker process still lives (starting, or busy): leave it be
        paths.socket.unlink(missing_ok=True)
        paths.secret.unlink(missing_ok=True)
    start_worker(node_config, paths, owner, wait=False)


def _exchange(paths: WorkerPaths, content: RecordDict, context: Context) -> RecordDict:
    """Run the task in the worker; the reply content (``context.state`` is updated)."""
    sock, secret = _connect(paths)
    with sock:
        # the task may take long: the ClientApp's round-timeout watchdog bounds the wait
        sock.settimeout(None)
        head = {
            "op": "task",
            "run_id": int(context.run_id),
            "node_id": int(context.node_id),
            "run_config": dict(context.run_config),
            "node_config": dict(context.node_config),
        }
        try:
            send_message(sock, head, {"content": content, "state": context.state}, secret=secret)
        except TypeError as exc:  # a config value JSON cannot carry
            raise WorkerUnavailable(f"cannot send the task ({exc})") from None
        reply, parts = recv_message(sock)
    if reply.get("ok") is not True:
        error = str(reply.get("error", "no reason given"))[:2000]
        if reply.get("kind") == "task":
            raise WorkerTaskError(error)
        raise WorkerUnavailable(f"the worker refused the task: {error}")
    if set(parts) != {"content", "state"}:
        raise ProtocolError(f"reply holds {sorted(parts)}, expected content and state")
    for name in list(context.state.keys()):
        del context.state[name]
    for name, record in parts["state"].items():
        context.state[name] = record
    return parts["content"]


def forward(content: RecordDict, context: Context) -> RecordDict | None:
    """The task's reply content from this node's worker, or None to run it in process.

    Each way of falling back logs one line. A task that fails in the worker raises
    :class:`WorkerTaskError` (running it again here would fail the same way).
    """
    node_config = dict(context.node_config)
    owner = supernode_pid()
    try:
        paths = worker_paths(node_config, owner)
    except WorkerUnavailable as exc:
        log(f"resident worker unusable ({exc}); running the task in the ClientApp process")
        return None
    try:
        return _exchange(paths, content, context)
    except FileNotFoundError:
        pass  # no worker on this node yet (or it left when idle): start one, below
    except (OSError, ProtocolError, WorkerUnavailable) as exc:
        log(
            f"resident worker failed ({exc}); running the task in the ClientApp process "
            "and starting a new worker"
        )
        try:
            restart_worker(node_config, paths, owner)
        except OSError as start_error:
            log(f"cannot start a new resident worker ({start_error})")
        return None
    try:
        start_worker(node_config, paths, owner, wait=True)
        return _exchange(paths, content, context)
    except (OSError, ProtocolError, WorkerUnavailable) as exc:
        log(f"resident worker not available ({exc}); running the task in the ClientApp process")
        return None
