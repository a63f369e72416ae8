"""The resident worker of one SuperNode: keeps torch, the dataset and the experiment loaded.

Started by the node's first ClientApp (see :mod:`.resident`) or by hand, after the
SuperNode, with the SuperNode's node config and pid::

    python -m fedshift.engine.flower.worker --node-config "partition-id=0 num-partitions=3" \\
        --supernode-pid 12345 [--idle-timeout 600]

It answers one request at a time on its Unix socket: a request must carry the worker's
secret and come from a process of this user, every frame is checked (:mod:`.wire`), and a
malformed one is refused with one line on stderr (the SuperNode's log) without stopping
the worker. A task runs through :func:`fedshift.engine.flower.clientapp.answer`, the
ClientApp's own code, on the ``Context.state`` the ClientApp sent; the reply and the new
state go back. The worker leaves when the SuperNode is gone, after ``--idle-timeout``
seconds without a request (0: never), on SIGTERM, or, like the ClientApp, once a task has
run past the server's round timeout plus the grace period (a run that no longer needs it).
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
from fedshift.engine.flower.resident import WorkerPaths, WorkerUnavailable, worker_paths
from fedshift.engine.flower.wire import ProtocolError, recv_message, send_message

#: seconds a client may take to send its request before it is dropped
READ_TIMEOUT = 60.0
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

    def __init__(self, node_config: Mapping[str, Any], supernode: int, idle_timeout: float):
        self.paths: WorkerPaths = worker_paths(node_config, supernode)
        self.supernode = supernode
        self.idle_timeout = idle_timeout
        self.secret = secrets.token_hex(32)
        self.tasks = 0
        self.rejected = 0
        self.listener: socket.socket | None = None
        self.default_threads = 0

    def _write_secret(self) -> None:
        tmp = self.paths.secret.with_name(f".{self.paths.secret.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(self.secret)
        os.replace(tmp, self.paths.secret)

    def _listen(self) -> None:
        self.paths.socket.unlink(missing_ok=True)  # a worker that was killed left it
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(self.paths.socket))
        os.chmod(self.paths.socket, 0o600)
        listener.listen(16)
        listener.settimeout(TICK)
        self.listener = listener

    def cleanup(self) -> None:
        """Remove the socket and secret if they are still this worker's."""
        try:
            if self.paths.secret.read_text().strip() == self.secret:
                self.paths.socket.unlink(missing_ok=True)
                self.paths.secret.unlink(missing_ok=True)
        except OSError:
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
            import torch  # the imports this worker exists to keep

            from fedshift.engine.flower import clientapp  # noqa: F401

            self.default_threads = torch.get_num_threads()
            self._write_secret()
            self._listen()
            log(f"serving {self.paths.socket} for SuperNode pid {self.supernode}")
            try:
                return self._loop()
            finally:
                self.cleanup()

    def _loop(self) -> int:
        assert self.listener is not None
        last = time.monotonic()
        while True:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                if not _alive(self.supernode):
                    log(f"SuperNode pid {self.supernode} is gone; leaving")
                    return 0
                if self.idle_timeout > 0 and time.monotonic() - last > self.idle_timeout:
                    log(f"idle for {self.idle_timeout:g} s; leaving")
                    return 0
                continue
            with conn:
                try:
                    self.handle(conn)
                except OSError as exc:  # the ClientApp went away mid-exchange
                    log(f"lost a ClientApp: {exc.__class__.__name__}: {exc}")
            last = time.monotonic()

    def _refuse(self, conn: socket.socket, reason: str) -> None:
        self.rejected += 1
        log(f"rejected a request: {reason}")
        try:
            send_message(conn, {"ok": False, "kind": "protocol", "error": reason}, {})
        except OSError:
            pass

    def handle(self, conn: socket.socket) -> None:
        """Answer one connection: a ping or a task; anything malformed is refused."""
        uid = _peer_uid(conn)
        if uid is not None and uid != os.getuid():
            self._refuse(conn, f"peer user id {uid} is not this worker's")
            return
        conn.settimeout(READ_TIMEOUT)
        try:
            head, parts = recv_message(conn)
        except (ProtocolError, OSError) as exc:
            self._refuse(conn, str(exc) or exc.__class__.__name__)
            return
        if not hmac.compare_digest(str(head.get("secret", "")).encode(), self.secret.encode()):
            self._refuse(conn, "wrong secret")
            return
        op = head.get("op")
        if op == "ping":
            status = {"ok": True, "pid": os.getpid(), "tasks": self.tasks}
            send_message(conn, {**status, "rejected": self.rejected}, {})
            return
        if op != "task":
            self._refuse(conn, f"unknown op {op!r}")
            return
        try:
            context = self._context(head, parts)
        except ProtocolError as exc:
            self._refuse(conn, str(exc))
            return
        conn.settimeout(None)
        self._run(conn, parts["content"], context)

    def _context(self, head: dict[str, Any], parts: dict[str, Any]):
        """The Flower Context the task runs in, from a checked request."""
        from flwr.app import Context

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
        if CONTROL not in parts["content"]:
            raise ProtocolError("the task carries no engine instructions")
        return Context(
            run_id=head["run_id"],
            node_id=head["node_id"],
            node_config=head["node_config"],
            state=parts["state"],
            run_config=head["run_config"],
        )

    def _run(self, conn: socket.socket, content, context) -> None:
        import torch

        from fedshift.engine.flower.clientapp import GRACE, answer, experiment_of

        timeout = float(dict(content[CONTROL]).get("timeout", 0.0) or 0.0)
        watchdog = None
        if timeout > 0:
            watchdog = threading.Timer(timeout + GRACE, self._give_up, args=(timeout + GRACE,))
            watchdog.daemon = True
            watchdog.start()
        try:
            # a run config with threads=0 gets torch's default, whatever an earlier run set
            threads = experiment_of(context).cfg.threads
            torch.set_num_threads(threads if threads > 0 else self.default_threads)
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
        self.tasks += 1
        send_message(conn, {"ok": True}, {"content": reply, "state": context.state})

    def _give_up(self, seconds: float) -> None:
        """Leave at once: the task ran past the time the server waits for its reply."""
        log(f"the task ran {seconds:g} s, past the server's round timeout; leaving")
        self.cleanup()
        os._exit(3)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fedshift.engine.flower.worker",
        description="the resident fedshift worker of one Flower SuperNode",
    )
    config = parser.add_mutually_exclusive_group(required=True)
    config.add_argument("--node-config", help="the SuperNode's --node-config, verbatim")
    config.add_argument("--node-config-json", help=argparse.SUPPRESS)
    parser.add_argument("--supernode-pid", type=int, required=True, help="the SuperNode's pid")
    parser.add_argument(
        "--idle-timeout", type=float, default=600.0, help="seconds idle before leaving (0: never)"
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
        worker = Worker(node_config, args.supernode_pid, args.idle_timeout)
    except WorkerUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # runs the cleanup in serve()
    return worker.serve()


if __name__ == "__main__":
    sys.exit(main())
