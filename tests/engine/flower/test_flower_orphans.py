"""No ClientApp keeps training after its run failed (loopback Flower).

Flower 1.41 lets a running ClientApp finish its task after the run was stopped or failed
and then drops the reply. fedshift's ClientApp stops itself once the server's round
timeout has passed, so a failed run leaves no process computing for nothing.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="flwr is not installed; pip install -e '.[flower]'")

from test_flower import Cluster, e2e_settings, flower_bin, wait_run  # noqa: E402


def live_clientapps(ancestors: set[int]) -> list[int]:
    """Running (not zombie) ``flwr-clientapp`` processes below one of ``ancestors``."""
    parent: dict[int, int] = {}
    found: list[int] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        pid = int(proc.name)
        fields = stat.rsplit(")", 1)[1].split()
        parent[pid] = int(fields[1])
        if fields[0] != "Z" and any(a.endswith(b"flwr-clientapp") for a in argv[:2]):
            found.append(pid)

    def below(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid in ancestors:
                return True
        return False

    return [pid for pid in found if below(pid)]


#: the round timeout of the failing run (s): longer than a SuperNode needs to pull its task
#: on a busy machine (Flower 1.41's SuperNode polls every 3 s)
ROUND_TIMEOUT = 20.0


def received_task(log: str) -> bool:
    """Whether a SuperNode's log shows it received a training task (a node that had not
    pulled its task when the run failed ignores it: no ClientApp runs there)."""
    _, found, after = log.partition("Receiving: train message")
    for line in after.splitlines()[1:] if found else []:
        if "Received successfully" in line:
            return True
        if any(word in line for word in ("Ignoring", "Failed", "Receiving:")):
            return False
    return False


@pytest.mark.flower
def test_failed_run_leaves_no_clientapp_running(tmp_path_factory, digits_cache):
    """A task of minutes and a server that waits ROUND_TIMEOUT s, then fails the run
    (strict): the ClientApp of every node that received its task stops itself, and none
    is left running.

    Before, the server waited 4 s: on a busy machine no SuperNode had pulled its task (or
    said which client it serves) when the run failed, so no task ran and there was nothing
    to stop; and the test took any ClientApp process, an identity query's too, for a
    running task."""
    if not shutil.which(flower_bin("flower-superlink")):
        pytest.skip("flower-superlink is not on PATH")
    from fedshift.data import load_dataset

    load_dataset("digits-dg", cache_dir=digits_cache)
    cluster = Cluster(tmp_path_factory.mktemp("orphans"), digits_cache)
    try:
        cluster.start()
        nodes = {p.pid for p in cluster.nodes}
        settings = e2e_settings(
            cluster.root / "out",
            failure_policy="strict",
            local_epochs=200,
            **{"max-samples": 2000, "round-timeout": ROUND_TIMEOUT},
        )
        wait_run(cluster.submit("failing", settings), timeout=480)
        assert not (cluster.root / "out" / "summary.json").exists(), "the run should fail"
        # a ClientApp may still be starting: wait until each one that got a task stopped
        deadline = time.monotonic() + 240

        def tasks_and_stops() -> tuple[int, int]:
            logs = [(cluster.root / "logs" / f"node{i}.log").read_text() for i in range(3)]
            tasks = [received_task(text) for text in logs]
            stops = ["stopping this ClientApp" in text for text in logs]
            assert all(task or not stop for task, stop in zip(tasks, stops, strict=True))
            return sum(tasks), sum(stops)

        while (counts := tasks_and_stops())[0] != counts[1] or live_clientapps(nodes):
            assert time.monotonic() < deadline, (
                f"of {counts[0]} ClientApps with a task {counts[1]} stopped themselves, "
                f"{live_clientapps(nodes)} still run; see {cluster.root / 'logs'}"
            )
            time.sleep(0.5)
        assert counts[0] >= 1, f"no node received its task; see {cluster.root / 'logs'}"
    finally:
        cluster.stop_all()
