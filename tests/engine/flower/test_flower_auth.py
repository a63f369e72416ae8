"""SuperNode authentication on loopback, as Flower 1.41 offers it.

The SuperLink runs with TLS and ``--enable-supernode-auth``; one SuperNode's public key is
registered with ``flwr supernode register``, another's is not. The registered node is
accepted and listed online; the unregistered one is refused and never gets a node id.
The certificates and keys come from ``deploy/flower/make-keys.sh`` (openssl, ssh-keygen),
or from ``cryptography`` where those tools are missing; nothing is downloaded.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="flwr is not installed; pip install -e '.[flower]'")

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402
from test_flower import Cluster, flower_bin, free_port  # noqa: E402


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def make_tls(folder: Path) -> dict[str, Path]:
    """A CA and a server certificate for 127.0.0.1/localhost signed by it (PEM files)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("fedshift test CA"))
        .issuer_name(_name("fedshift test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP384R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {"ca": folder / "ca.crt", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


def make_node_key(folder: Path, name: str) -> tuple[Path, Path]:
    """An ECDSA P-384 key pair in OpenSSH format, as ``ssh-keygen -t ecdsa -b 384`` makes."""
    key = ec.generate_private_key(ec.SECP384R1())
    private, public = folder / name, folder / f"{name}.pub"
    private.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    public.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
    )
    private.chmod(0o600)
    return private, public


def flwr_cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess:
    env = {**cluster.env, "FLWR_HOME": str(cluster.root / "home-cli")}
    return subprocess.run(
        [flower_bin("flwr"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def control_api_up(cluster: Cluster) -> bool:
    """Whether the SuperLink's Control API answers: ``flwr supernode list --format json``
    exits 0 also when it cannot connect (Flower 1.41), saying so in its JSON, so the JSON's
    ``success`` decides (under load the SuperLink takes seconds to start)."""
    listed = flwr_cli(cluster, "supernode", "list", "--format", "json")
    try:
        return listed.returncode == 0 and json.loads(listed.stdout).get("success") is True
    except json.JSONDecodeError:
        return False


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def start_auth_superlink(cluster: Cluster, tls: dict, connection: str) -> None:
    """A SuperLink with TLS and SuperNode authentication, the CLI's config naming it
    ``connection``, and its Control API answering."""
    cluster.spawn(
        "superlink",
        [
            flower_bin("flower-superlink"),
            *("--host", "127.0.0.1", "--port", str(cluster.port)),
            *("--ssl-ca-certfile", str(tls["ca"]), "--ssl-certfile", str(tls["cert"])),
            *("--ssl-keyfile", str(tls["key"]), "--enable-supernode-auth"),
            "--disable-runtime-dependency-installation",
        ],
    )
    home = cluster.root / "home-cli"
    home.mkdir()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "{connection}"\n\n[superlink.{connection}]\n'
        f'address = "127.0.0.1:{cluster.port}"\nroot-certificates = "{tls["ca"]}"\n'
    )
    wait_for(lambda: control_api_up(cluster), 90, "the SuperLink's Control API over TLS")


@pytest.mark.flower
def test_only_registered_supernodes_connect(tmp_path_factory, digits_cache):
    if not shutil.which(flower_bin("flower-superlink")):
        pytest.skip("flower-superlink is not on PATH")
    cluster = Cluster(tmp_path_factory.mktemp("auth"), digits_cache)
    certs = cluster.root / "certs"
    if shutil.which("openssl") and shutil.which("ssh-keygen"):  # the documented script
        script = Path(__file__).resolve().parents[3] / "deploy" / "flower" / "make-keys.sh"
        subprocess.run(["bash", str(script), str(certs), "127.0.0.1", "2"], check=True)
        tls = {"ca": certs / "ca.crt", "cert": certs / "server.pem", "key": certs / "server.key"}
        registered_key, registered_pub = certs / "supernode-0", certs / "supernode-0.pub"
        stranger_key = certs / "supernode-1"
    else:
        certs.mkdir()
        tls = make_tls(certs)
        registered_key, registered_pub = make_node_key(certs, "registered")
        stranger_key, _ = make_node_key(certs, "stranger")
    try:
        start_auth_superlink(cluster, tls, "local-tls")
        done = flwr_cli(cluster, "supernode", "register", str(registered_pub), "local-tls")
        assert done.returncode == 0, done.stdout + done.stderr

        def node(name: str, key: Path, partition: int):
            return cluster.spawn(
                name,
                [
                    flower_bin("flower-supernode"),
                    "--superlink",
                    f"127.0.0.1:{cluster.port}",
                    "--root-certificates",
                    str(tls["ca"]),
                    "--auth-supernode-private-key",
                    str(key),
                    "--port",
                    str(free_port()),
                    "--node-config",
                    f"partition-id={partition} num-partitions=3",
                ],
            )

        node("registered", registered_key, 0)
        stranger = node("stranger", stranger_key, 1)
        logs = cluster.root / "logs"
        wait_for(
            lambda: "SuperNode ID" in (logs / "registered.log").read_text(),
            120,
            "the registered SuperNode",
        )
        listed = flwr_cli(cluster, "supernode", "list", "--format", "json")
        assert listed.returncode == 0, listed.stderr
        nodes = json.loads(listed.stdout)["nodes"]
        assert [n["status"] for n in nodes] == ["online"], nodes
        assert stranger.wait(timeout=90) != 0, "the unregistered SuperNode was let in"
        refused = (logs / "stranger.log").read_text()
        assert "Failed to activate SuperNode" in refused and "SuperNode ID" not in refused
    finally:
        cluster.stop_all()


@pytest.mark.flower
def test_supernode_auth_needs_tls(tmp_path):
    """Flower refuses ``--enable-supernode-auth`` on an insecure SuperLink (one line)."""
    if not shutil.which(flower_bin("flower-superlink")):
        pytest.skip("flower-superlink is not on PATH")
    env = {**os.environ, "FLWR_HOME": str(tmp_path), "FLWR_TELEMETRY_ENABLED": "0"}
    done = subprocess.run(
        [flower_bin("flower-superlink"), "--insecure", "--enable-supernode-auth"]
        + ["--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "requires encrypted TLS" in done.stdout + done.stderr
