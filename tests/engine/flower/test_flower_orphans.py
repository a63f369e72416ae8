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


@pytest.mark.flower
def test_failed_run_leaves_no_clientapp_running(tmp_path_factory, digits_cache):
    if not shutil.which(flower_bin("flower-superlink")):
        pytest.skip("flower-superlink is not on PATH")
    from fedshift.data import load_dataset

    load_dataset("digits-dg", cache_dir=digits_cache)
    cluster = Cluster(tmp_path_factory.mktemp("orphans"), digits_cache)
    try:
        cluster.start()
        nodes = {p.pid for p in cluster.nodes}
        # a task of minutes, a server that waits 4 s and fails the run (strict)
        settings = e2e_settings(
            cluster.root / "out",
            failure_policy="strict",
            local_epochs=200,
            **{"max-samples": 2000, "round-timeout": 4.0},
        )
        run = cluster.submit("failing", settings)
        deadline = time.monotonic() + 120
        while not live_clientapps(nodes):  # the training tasks started
            assert time.monotonic() < deadline, "no ClientApp started"
            time.sleep(0.2)
        wait_run(run, timeout=120)
        assert not (cluster.root / "out" / "summary.json").exists(), "the run should fail"
        while live_clientapps(nodes):
            assert time.monotonic() < deadline, (
                f"ClientApps {live_clientapps(nodes)} still run; see {cluster.root / 'logs'}"
            )
            time.sleep(0.5)
        logs = [(cluster.root / "logs" / f"node{i}.log").read_text() for i in range(3)]
        assert any("stopping this ClientApp" in text for text in logs)
    finally:
        cluster.stop_all()
