"""The resident worker of one SuperNode: keeps torch, the dataset and the experiment loaded.

Started by the node's first ClientApp (see :mod:`.resident`) or by hand, after the
SuperNode, with the SuperNode's node config and pid::

    python -m fedshift.engine.flower.transport.worker \\
        --node-config "partition-id=0 num-partitions=3" --supernode-pid 12345 [--idle-timeout 600]

Each connection is read on a thread of its own (at most :data:`MAX_CONNECTIONS` at once; one
more is refused at once), so a slow or hostile request never delays another client's: a
ping is answered while another request trickles in, and tasks run one at a time in the order
their requests were complete. A request must come from a process of this user and open
with the worker's secret in a fixed-size prologue, checked before anything else is read; it
must arrive whole within ``--request-deadline`` seconds (a deadline for the whole request)
and be decoded within ``--request-cpu-budget`` seconds of CPU (:class:`.wire.CpuBudget`;
every step of the decoding is linear in its bytes); every frame is bounded and checked
before room is made for it (:mod:`.wire`), and so are the run and node configs and the
task's instructions. Anything else is refused with one line to
the client and one on stderr (the SuperNode's log), and the worker keeps serving. A task
runs through :func:`fedshift.engine.flower.clientapp.answer`, the ClientApp's own code, on
the ``Context.state`` the ClientApp sent; the reply and the new state go back. The worker
leaves when the SuperNode is gone, after ``--idle-timeout`` seconds without a request (0:
never), on SIGTERM, or, like the ClientApp, once a task has run past the server's round
timeout plus the grace period (a run that no longer needs it).
"""

from __future__ import annotations

import argparse
import fcntl
import hmac
import json
import os
import secrets
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from fedshift.engine.flower.messages import CONTROL
from fedshift.engine.flower.transport.resident import (
    WorkerPaths,
    WorkerUnavailable,
    read_secret,
    worker_paths,
)
from fedshift.engine.flower.transport.wire import (
    PROLOGUE,
    CpuBudget,
    ProtocolError,
    finite_or_none,
    prologue,
    recv_exact,
    recv_message,
    send_message,
)

#: seconds a client may take to send its whole request before it is dropped
REQUEST_DEADLINE = 60.0
#: seconds of CPU one request may spend being read and decoded (a 16 MiB head takes well
#: under one; the task it carries is not counted)
REQUEST_CPU_BUDGET = 5.0
#: connections read at once; one more is refused at once
MAX_CONNECTIONS = 16
#: what decoding a hostile request may raise besides ProtocolError: refused, never fatal
DECODING_ERRORS = (ProtocolError, ValueError, TypeError, KeyError, RecursionError, MemoryError)
#: seconds between checks of the SuperNode and the idle timeout
TICK = 0.5


def log(text: str) -> None:
    print(f"fedshift worker {os.getpid()}: {text}", file=sys.stderr, flush=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _peer_uid(conn: socket.socket) -> int | None:
    """The user id of the connecting process (Linux SO_PEERCRED), None where unknown."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, option, 12))
    return uid


class Worker:
    """Serves the tasks of one SuperNode on a Unix socket."""

    def __init__(
        self,
        node_config: Mapping[str, Any],
        supernode: int,
        idle_timeout: float,
        request_deadline: float = REQUEST_DEADLINE,
        request_cpu_budget: float = REQUEST_CPU_BUDGET,
    ):
        self.paths: WorkerPaths = worker_paths(node_config, supernode)
        self.supernode = supernode
        self.idle_timeout = idle_timeout
        self.request_deadline = request_deadline
        self.request_cpu_budget = request_cpu_budget
        #: one task at a time (they share torch and the node's experiment)
        self.task_lock = threading.Lock()
        #: guards the counters below
        self.counts = threading.Lock()
        self.open_connections = 0
        self.last_active = time.monotonic()
        self.secret = secrets.token_hex(32)
        self.prologue = prologue(self.secret)
        self.tasks = 0
        self.rejected = 0
        self.listener: socket.socket | None = None

    def _write_secret(self) -> None:
        tmp = self.paths.secret.with_name(f".{self.paths.secret.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(self.secret)
        os.replace(tmp, self.paths.secret)

    def _listen(self) -> None:
        """Listen on a private name first, then rename it into place (replacing the socket
        a killed worker left): a ClientApp that finds the socket finds it listening, never
        bound but not yet accepting (a refused connection it would take for a dead worker)."""
        # no longer than the real name (a Unix socket path is short)
        staging = self.paths.socket.with_name(f".{os.getpid()}.sock")
        staging.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(staging))
        os.chmod(staging, 0o600)
        listener.listen(16)
        listener.settimeout(TICK)
        os.replace(staging, self.paths.socket)
        self.listener = listener

    def cleanup(self) -> None:
        """Remove the socket and secret if they are still this worker's."""
        try:
            if read_secret(self.paths.secret) == self.secret:
                self.paths.socket.unlink(missing_ok=True)
                self.paths.secret.unlink(missing_ok=True)
        except (OSError, WorkerUnavailable):
            pass

    def serve(self) -> int:
        """Hold the node's life lock, listen, answer until a reason to leave; exit code."""
        with open(self.paths.life_lock, "a+") as life:
            try:
                fcntl.flock(life, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                log(f"another worker serves {self.paths.socket}; leaving")
                return 0
            life.truncate(0)
            life.write(f"{os.getpid()}\n")
            life.flush()
            import torch  # noqa: F401 - the imports this worker exists to keep

            from fedshift.engine.flower import clientapp  # noqa: F401

            self._write_secret()
            self._listen()
            log(f"serving {self.paths.socket} for SuperNode pid {self.supernode}")
            try:
                return self._loop()
            finally:
                self.cleanup()

    def _idle_for(self) -> float:
        """Seconds since the last connection ended; 0 while one is open."""
        with self.counts:
            if self.open_connections:
                return 0.0
            return time.monotonic() - self.last_active

    def _loop(self) -> int:
        assert self.listener is not None
        while True:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                if not _alive(self.supernode):
                    log(f"SuperNode pid {self.supernode} is gone; leaving")
                    return 0
                if self.idle_timeout > 0 and self._idle_for() > self.idle_timeout:
                    log(f"idle for {self.idle_timeout:g} s; leaving")
                    return 0
                continue
            with self.counts:
                full = self.open_connections >= MAX_CONNECTIONS
                if not full:
                    self.open_connections += 1
            if full:
                with conn:
                    self._refuse(conn, f"busy: {MAX_CONNECTIONS} requests are being read")
                continue
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        """Answer one connection on its own thread, so it never delays another's."""
        try:
            with conn:
                self.handle(conn)
        except OSError as exc:  # the ClientApp went away mid-exchange
            log(f"lost a ClientApp: {exc.__class__.__name__}: {exc}")
        except DECODING_ERRORS as exc:  # a reply that cannot be sent back
            log(f"dropped a request: {exc.__class__.__name__}: {exc}")
        finally:
            with self.counts:
                self.open_connections -= 1
                self.last_active = time.monotonic()

    def _refuse(self, conn: socket.socket, reason: str) -> None:
        reason = " ".join(reason.split())[:500]
        with self.counts:
            self.rejected += 1
        log(f"rejected a request: {reason}")
        try:
            conn.settimeout(1.0)
            send_message(conn, {"ok": False, "kind": "protocol", "error": reason}, {})
        except OSError:
            pass

    def handle(self, conn: socket.socket) -> None:
        """Answer one connection: a ping or a task; anything malformed is refused.

        The secret comes first, in a fixed-size prologue: without it nothing more is read.
        The whole request must arrive by one deadline and be decoded within the CPU budget.
        """
        uid = _peer_uid(conn)
        if uid is not None and uid != os.getuid():
            self._refuse(conn, f"peer user id {uid} is not this worker's")
            return
        deadline = time.monotonic() + self.request_deadline
        try:
            opening = recv_exact(conn, PROLOGUE.size, deadline)
        except (ProtocolError, OSError) as exc:
            self._refuse(conn, f"no prologue: {str(exc) or exc.__class__.__name__}")
            return
        if not hmac.compare_digest(opening, self.prologue):
            self._refuse(conn, "wrong secret")
            return
        try:
            head, parts = recv_message(conn, deadline, CpuBudget(self.request_cpu_budget))
            op = head.get("op")
            if op == "ping":
                status = {"ok": True, "pid": os.getpid(), "tasks": self.tasks}
                send_message(conn, {**status, "rejected": self.rejected}, {})
                return
            if op != "task":
                raise ProtocolError(f"unknown op {str(op)[:40]!r}")
            context, timeout = self._context(head, parts)
        except DECODING_ERRORS as exc:
            self._refuse(conn, str(exc) or exc.__class__.__name__)
            return
        except OSError as exc:
            self._refuse(conn, f"{exc.__class__.__name__}: {exc}")
            return
        conn.settimeout(None)
        with self.task_lock:
            self._run(conn, parts["content"], context, timeout)

    def _context(self, head: dict[str, Any], parts: dict[str, Any]):
        """The Flower Context the task runs in and the task's timeout, from a checked
        request."""
        from flwr.app import ConfigRecord, Context

        for key in ("run_config", "node_config"):
            value = head.get(key)
            if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
                raise ProtocolError(f"{key} is not an object")
            if any(isinstance(v, dict | list) for v in value.values()):
                raise ProtocolError(f"{key} holds a nested value")
        for key in ("run_id", "node_id"):
            if not isinstance(head.get(key), int) or isinstance(head.get(key), bool):
                raise ProtocolError(f"{key} is not an integer")
        if set(parts) != {"content", "state"}:
            raise ProtocolError(f"request holds {sorted(parts)}, expected content and state")
        control = parts["content"][CONTROL] if CONTROL in parts["content"] else None
        if not isinstance(control, ConfigRecord):
            raise ProtocolError("the task carries no engine instructions")
        timeout = control.get("timeout", 0.0)
        is_number = isinstance(timeout, int | float) and not isinstance(timeout, bool)
        if not is_number or not (timeout == 0 or finite_or_none(timeout)):
            raise ProtocolError(f"timeout {str(timeout)[:40]!r} is not a number of seconds")
        context = Context(
            run_id=head["run_id"],
            node_id=head["node_id"],
            node_config=head["node_config"],
            state=parts["state"],
            run_config=head["run_config"],
        )
        return context, float(timeout)

    def _run(self, conn: socket.socket, content, context, timeout: float) -> None:
        from fedshift.engine.compute import set_run_threads
        from fedshift.engine.flower.clientapp import GRACE, answer, experiment_of

        watchdog = None
        if timeout > 0:
            watchdog = threading.Timer(timeout + GRACE, self._give_up, args=(timeout + GRACE,))
            watchdog.daemon = True
            watchdog.start()
        try:
            # the run's own count, whatever an earlier run of this worker set
            set_run_threads(experiment_of(context).cfg.threads)
            reply = answer(content, context)
        except Exception as exc:  # noqa: BLE001 - the task's failure goes back to the ClientApp
            log(f"task failed: {exc.__class__.__name__}: {exc}")
            send_message(
                conn, {"ok": False, "kind": "task", "error": f"{exc.__class__.__name__}: {exc}"}, {}
            )
            return
        finally:
            if watchdog is not None:
                watchdog.cancel()
        with self.counts:
            self.tasks += 1
        send_message(conn, {"ok": True}, {"content": reply, "state": context.state})

    def _give_up(self, seconds: float) -> None:
        """Leave at once: the task ran past the time the server waits for its reply."""
        log(f"the task ran {seconds:g} s, past the server's round timeout; leaving")
        self.cleanup()
        os._exit(3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedshift.engine.flower.transport.worker",
        description="the resident fedshift worker of one Flower SuperNode",
    )
    config = parser.add_mutually_exclusive_group(required=True)
    config.add_argument("--node-config", help="the SuperNode's --node-config, verbatim")
    config.add_argument("--node-config-json", help=argparse.SUPPRESS)
    parser.add_argument("--supernode-pid", type=int, required=True, help="the SuperNode's pid")
    parser.add_argument(
        "--idle-timeout", type=float, default=600.0, help="seconds idle before leaving (0: never)"
    )
    parser.add_argument(
        "--request-deadline",
        type=float,
        default=REQUEST_DEADLINE,
        help="seconds a client may take to send its whole request",
    )
    parser.add_argument(
        "--request-cpu-budget",
        type=float,
        default=REQUEST_CPU_BUDGET,
        help="seconds of CPU a request may take to be read and decoded (not its task)",
    )
    args = parser.parse_args(argv)
    if args.node_config_json is not None:
        node_config = json.loads(args.node_config_json)
    else:
        from flwr.common.config import parse_config_args

        node_config = parse_config_args([args.node_config])
    if not _alive(args.supernode_pid):
        print(f"error: no process {args.supernode_pid}", file=sys.stderr)
        return 2
    try:
        worker = Worker(
            node_config,
            args.supernode_pid,
            args.idle_timeout,
            args.request_deadline,
            args.request_cpu_budget,
        )
    except WorkerUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # runs the cleanup in serve()
    return worker.serve()


if __name__ == "__main__":
    sys.exit(main())
