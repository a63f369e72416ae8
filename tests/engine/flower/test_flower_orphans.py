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
#: on a busy machine (Flower 1.41's SuperNode polls every 3 s), so every node runs it
ROUND_TIMEOUT = 20.0


@pytest.mark.flower
def test_failed_run_leaves_no_clientapp_running(tmp_path_factory, digits_cache):
    """A task of minutes and a server that waits ROUND_TIMEOUT s, then fails the run
    (strict): every node's ClientApp stops itself and none is left running.

    Before, the server waited 4 s: on a busy machine a SuperNode had not yet pulled its
    task (or said which client it serves) when the run failed, so no task ever ran and
    there was nothing to stop."""
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
        # a ClientApp may still be starting: wait until each node's has stopped itself
        deadline = time.monotonic() + 240

        def stopped() -> int:
            logs = [(cluster.root / "logs" / f"node{i}.log").read_text() for i in range(3)]
            return sum("stopping this ClientApp" in text for text in logs)

        while stopped() < 3 or live_clientapps(nodes):
            assert time.monotonic() < deadline, (
                f"{stopped()} of 3 ClientApps stopped themselves, {live_clientapps(nodes)} "
                f"still run; see {cluster.root / 'logs'}"
            )
            time.sleep(0.5)
    finally:
        cluster.stop_all()
