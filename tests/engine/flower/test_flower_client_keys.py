"""Client ids bound to SuperNode keys (#34 item 5): with ``client-keys`` a registered node
may claim only the client its key is bound to; the refusal is logged and told to the node.

In process, a grid that reports each node's registered key as Flower 1.41's ``get_nodes``
does (``NodeInfo.public_key``, PEM); on loopback, a SuperLink with TLS and SuperNode
authentication where a registered but unbound node names another node's client.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="flwr is not installed; pip install -e '.[flower]'")

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from flwr.app import Context, RecordDict  # noqa: E402
from flwr.proto.node_pb2 import NodeInfo  # noqa: E402
from test_flower import (  # noqa: E402
    Cluster,
    LocalGrid,
    e2e_settings,
    flower_bin,
    free_port,
    run_config,
    task_identity,  # noqa: F401 - a fixture, used by name
    wait_run,
)
from test_flower_auth import (  # noqa: E402
    flwr_cli,
    make_node_key,
    make_tls,
    start_auth_superlink,
    wait_for,
)

from fedshift.core.errors import ConfigError  # noqa: E402
from fedshift.engine.flower.client_keys import load_client_keys  # noqa: E402
from fedshift.engine.flower.messages import CONTROL, REFUSED  # noqa: E402
from fedshift.engine.flower.serverapp import run_on_grid  # noqa: E402

#: the impostor's node id: lower than the honest nodes' (100-102), so it claims first
IMPOSTOR = 99


def pem_key() -> tuple[bytes, bytes]:
    """A P-384 key as Flower keeps it (PEM SubjectPublicKeyInfo) and as OpenSSH writes it."""
    public = ec.generate_private_key(ec.SECP384R1()).public_key()
    pem = public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    ssh = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return pem, ssh


class KeyedGrid(LocalGrid):
    """Three honest nodes and a registered impostor (node 99) naming partition 0; each
    node's registered key is reported by ``get_nodes`` as the SuperLink reports it."""

    def __init__(self, rc, keys: dict[int, bytes]):
        super().__init__(rc)
        honest = self.contexts[100]
        self.contexts = {
            IMPOSTOR: Context(
                run_id=1,
                node_id=IMPOSTOR,
                node_config=dict(honest.node_config),
                state=RecordDict(),
                run_config=dict(rc),
            ),
            **self.contexts,
        }
        self.keys = keys

    def get_nodes(self):
        return [NodeInfo(node_id=node, public_key=self.keys[node]) for node in self.contexts]


def refusals(grid: LocalGrid) -> dict[int, str]:
    """The reasons the ServerApp sent to refused nodes."""
    found = {}
    for node, message in grid.pushed:
        control = message.content[CONTROL] if CONTROL in message.content else {}
        if control.get("task") == REFUSED:
            found[node] = str(control["reason"])
    return found


@pytest.mark.usefixtures("task_identity")
def test_a_registered_but_unbound_node_cannot_take_another_nodes_client(
    tmp_path, digits_cache, caplog
):
    keys = {node: pem_key() for node in (IMPOSTOR, 100, 101, 102)}
    grid_keys = {node: pem for node, (pem, _) in keys.items()}
    folder = tmp_path / "keys"
    folder.mkdir()
    for i, node in enumerate((100, 101, 102)):
        (folder / f"node{i}.pub").write_bytes(keys[node][1])  # OpenSSH, as registered
    bindings = tmp_path / "client-keys.toml"
    bindings.write_text("".join(f'{i} = "keys/node{i}.pub"\n' for i in range(3)))

    # without bindings the impostor, the lower node id, takes client 0 (the issue)
    rc = run_config(tmp_path, "open", digits_cache, rounds=1)
    grid = KeyedGrid(rc, grid_keys)
    summary, _ = run_on_grid(grid, rc)
    assert summary["failed_clients"] == 0 and 100 in refusals(grid)
    assert IMPOSTOR not in refusals(grid)

    rc = run_config(tmp_path, "bound", digits_cache, rounds=1, **{"client-keys": str(bindings)})
    grid = KeyedGrid(rc, grid_keys)
    with caplog.at_level(logging.WARNING, "fedshift.engine.flower.federation"):
        summary, _ = run_on_grid(grid, rc)
    assert summary["failed_clients"] == 0
    reason = refusals(grid)
    assert list(reason) == [IMPOSTOR], reason
    assert "client 0 is bound to key SHA256:" in reason[IMPOSTOR]
    assert (
        "this node's key SHA256:" in reason[IMPOSTOR] and "bound to no client" in reason[IMPOSTOR]
    )
    assert f"node {IMPOSTOR} refused: client 0 is bound to key" in caplog.text
    served = {m.metadata.dst_node_id for _, m in grid.pushed if m.metadata.message_type == "train"}
    assert served == {100, 101, 102}


def test_client_keys_files_are_checked_before_the_first_round(tmp_path):
    _, ssh = pem_key()
    (tmp_path / "a.pub").write_bytes(ssh)
    (tmp_path / "junk.pub").write_text("not a key")
    cases = {
        '0 = "a.pub"\n1 = 7\n': "binds no node to clients [2]",
        '0 = "a.pub"\n1 = "a.pub"\n2 = 3\n': "binds one key to clients [0, 1]",
        '0 = "junk.pub"\n1 = 5\n2 = 6\n': "junk.pub is not an OpenSSH or PEM public key",
        '9 = "a.pub"\n': "9 is not a client of this task",
        'x = "a.pub"\n': "'x' is not a client id",
        "0 = true\n": "give a public key file or a node id",
    }
    for text, expected in cases.items():
        (tmp_path / "ck.toml").write_text(text)
        with pytest.raises(ConfigError, match=expected.replace("[", r"\[").replace("]", r"\]")):
            load_client_keys(tmp_path / "ck.toml", [0, 1, 2])
    (tmp_path / "ck.toml").write_text('0 = "a.pub"\n1 = 5\n2 = 6\n')
    bound = load_client_keys(tmp_path / "ck.toml", [0, 1, 2])
    bound.check(1, 5, None)
    with pytest.raises(ConfigError, match="client 1 is bound to node 5 by client-keys, not"):
        bound.check(1, 6, None)


def test_a_client_cannot_be_bound_twice_by_another_spelling_of_its_id(tmp_path):
    """#47 item 2: ``00``, ``+0``, ``" 1"``, ``0_0`` and an Arabic-Indic digit are all
    ``int()``-able; each is refused in one line naming its line, as is a node id no
    SuperLink can issue (0, 1, 2**64, 2**70)."""
    _, ssh = pem_key()
    (tmp_path / "a.pub").write_bytes(ssh)
    (tmp_path / "b.pub").write_bytes(pem_key()[1])
    good = '0 = "a.pub"\n1 = 5\n2 = 6\n'
    cases = {
        good + '00 = "b.pub"\n': "line 4: '00' is not a client id",
        good + '"+0" = "b.pub"\n': "line 4: '+0' is not a client id",
        good + '" 1" = 7\n': "line 4: ' 1' is not a client id",
        good + '0_0 = "b.pub"\n': "line 4: '0_0' is not a client id",
        '0 = "a.pub"\n1 = 5\n"\u0662" = 6\n': "line 3: '\u0662' is not a client id",
        '0 = "a.pub"\n# a comment\n1 = 1180591620717411303424\n2 = 6\n': (
            "line 3: client 1 = 1180591620717411303424; a node id is from 2 to 2**64 - 1"
        ),
        '0 = "a.pub"\n1 = 18446744073709551616\n2 = 6\n': "line 2: client 1 = 1844",
        '0 = "a.pub"\n1 = 0\n2 = 6\n': "line 2: client 1 = 0; a node id is from 2",
        '0 = "a.pub"\n1 = -5\n2 = 6\n': "line 2: client 1 = -5; a node id is from 2",
    }
    for text, expected in cases.items():
        (tmp_path / "ck.toml").write_text(text, encoding="utf-8")
        with pytest.raises(ConfigError, match="^client-keys file .*" + re.escape(expected)):
            load_client_keys(tmp_path / "ck.toml", [0, 1, 2])
    (tmp_path / "ck.toml").write_text('0 = "a.pub"\n1 = 18446744073709551615\n2 = 2\n')
    bound = load_client_keys(tmp_path / "ck.toml", [0, 1, 2])
    assert bound.node_ids == {1: 2**64 - 1, 2: 2}


@pytest.mark.flower
@pytest.mark.slow  # a SuperLink with TLS, four SuperNodes and one round: about 2 minutes
def test_e2e_an_unbound_registered_node_is_refused_on_loopback(tmp_path_factory, digits_cache):
    """Four registered SuperNodes on loopback: the honest three bound to clients 0-2 in
    ``client-keys``, a fourth (registered, bound to nothing) naming partition 0 like
    node 0. The run completes with no failed client, the ServerApp logs the refusal and
    the impostor's log shows it."""
    if not shutil.which(flower_bin("flower-superlink")):
        pytest.skip("flower-superlink is not on PATH")
    from fedshift.data import load_dataset

    load_dataset("digits-dg", cache_dir=digits_cache)
    cluster = Cluster(tmp_path_factory.mktemp("bound"), digits_cache)
    certs = cluster.root / "certs"
    certs.mkdir()
    tls = make_tls(certs)
    names = ["node0", "node1", "node2", "impostor"]
    node_keys = {name: make_node_key(certs, name) for name in names}
    bindings = certs / "client-keys.toml"
    bindings.write_text("".join(f'{i} = "node{i}.pub"\n' for i in range(3)))
    try:
        start_auth_superlink(cluster, tls, "local-deployment")
        for name in names:
            done = flwr_cli(cluster, "supernode", "register", str(node_keys[name][1]))
            assert done.returncode == 0, done.stdout + done.stderr
        partitions = {"node0": 0, "node1": 1, "node2": 2, "impostor": 0}
        for name in ["impostor", *names[:3]]:  # the impostor connects first
            cluster.spawn(
                name,
                [
                    flower_bin("flower-supernode"),
                    "--superlink",
                    f"127.0.0.1:{cluster.port}",
                    "--root-certificates",
                    str(tls["ca"]),
                    "--auth-supernode-private-key",
                    str(node_keys[name][0]),
                    "--port",
                    str(free_port()),
                    "--node-config",
                    f"partition-id={partitions[name]} num-partitions=3",
                ],
            )
        logs = cluster.root / "logs"
        wait_for(
            lambda: all("SuperNode ID" in (logs / f"{n}.log").read_text() for n in names),
            180,
            "four registered SuperNodes",
        )
        app = cluster.root / "app"
        app.mkdir()
        app_dir = Path(__file__).resolve().parents[3] / "deploy" / "flower"
        (app / "pyproject.toml").write_text((app_dir / "pyproject.toml").read_text())
        out = cluster.root / "out"
        settings = e2e_settings(out, rounds=1, **{"client-keys": str(bindings)})
        wait_run(cluster.submit("bound", settings), timeout=480)
        run_log = (logs / "run-bound.log").read_text()
        assert (out / "summary.json").is_file(), run_log[-3000:]
        assert json.loads((out / "summary.json").read_text())["failed_clients"] == 0
        assert "refused: client 0 is bound to key SHA256:" in run_log, run_log[-3000:]
        assert "the ServerApp refused this SuperNode" in (logs / "impostor.log").read_text()
    finally:
        cluster.stop_all()
