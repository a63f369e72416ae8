"""Client ids bound to SuperNode keys: which registered machine may serve which client.

With SuperNode authentication (``--enable-supernode-auth``) only machines whose public key
was registered (``flwr supernode register KEY.pub``) connect, but each says itself which
client it serves (its ``--node-config``). The run config key ``client-keys`` names a TOML
file on the ServerApp's machine that binds every client of the task to one node::

    # client id = the node's public key file (as given to `flwr supernode register`)
    0 = "keys/supernode-0.pub"
    1 = "keys/supernode-1.pub"
    # or the node id the SuperLink gave that registered key (`flwr supernode list`)
    2 = 4470381152474592271

A relative key path is read from the file's folder. Flower 1.41 gives the ServerApp each
online node's registered public key (``Grid.get_nodes()``: ``NodeInfo.public_key``, PEM
SubjectPublicKeyInfo) and its node id; a node whose key (or id) is not the one bound to
the client it names is refused, whatever the order in which nodes connect. Keys are
compared as parsed public keys, so an OpenSSH ``.pub`` file and the PEM Flower keeps match.
"""

from __future__ import annotations

import hashlib
import re
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedshift.core.bounded import MAX_TOML_BYTES, parse_toml, read_bytes_bounded
from fedshift.core.errors import ConfigError

#: the largest public key file read (an OpenSSH or PEM public key is well under 1 KiB)
MAX_KEY_BYTES = 16 << 10
#: a client id as written in the file: decimal digits, no sign, space, ``_`` or leading zero
CANONICAL_ID = re.compile(r"0|[1-9][0-9]{0,17}")
#: the node ids a Flower 1.41 SuperLink issues: 8 random bytes, never 0 or its own id (1)
NODE_IDS = range(2, 1 << 64)


def public_key_der(data: bytes, where: str) -> bytes:
    """The DER SubjectPublicKeyInfo of an OpenSSH or PEM public key (a ConfigError naming
    ``where`` when ``data`` holds neither)."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    text = data.strip()
    try:
        if text.startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(text)
        else:
            key = serialization.load_ssh_public_key(text)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        reason = " ".join(str(exc).split())[:120] or exc.__class__.__name__
        raise ConfigError(f"{where} is not an OpenSSH or PEM public key ({reason})") from None
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def fingerprint(der: bytes) -> str:
    """A short name of a public key for log lines: ``SHA256:`` and 16 hex digits."""
    return "SHA256:" + hashlib.sha256(der).hexdigest()[:16]


@dataclass(frozen=True)
class ClientKeys:
    """Each client's bound node: a public key (DER) or a node id."""

    keys: dict[int, bytes]
    node_ids: dict[int, int]

    def check(self, cid: int, node: int, node_key: bytes | None) -> None:
        """Refuse (ConfigError, one line) ``node``, holding the registered key
        ``node_key`` (DER; None when the SuperLink has none), as the server of ``cid``."""
        if cid in self.node_ids:
            if node != self.node_ids[cid]:
                raise ConfigError(
                    f"client {cid} is bound to node {self.node_ids[cid]} by client-keys, "
                    f"not to node {node}"
                )
            return
        if node_key is None:
            raise ConfigError(
                f"client {cid} is bound to key {fingerprint(self.keys[cid])} by client-keys "
                "and the SuperLink holds no registered key for this node (use "
                "--enable-supernode-auth)"
            )
        if node_key != self.keys[cid]:
            own = [c for c, key in self.keys.items() if key == node_key]
            bound = f"client {own[0]}" if own else "no client"
            raise ConfigError(
                f"client {cid} is bound to key {fingerprint(self.keys[cid])} by client-keys; "
                f"this node's key {fingerprint(node_key)} is bound to {bound}"
            )


def key_lines(raw: bytes) -> dict[str, int]:
    """The line number of each top-level key of a TOML file written one ``key = value``
    per line (the form of a client-keys file); a key on no such line is left out."""
    lines: dict[str, int] = {}
    for number, line in enumerate(raw.decode("utf-8", "replace").splitlines(), start=1):
        try:
            found = tomllib.loads(line)
        except (tomllib.TOMLDecodeError, ValueError):
            continue
        for key in found:
            lines.setdefault(key, number)
    return lines


def _client_id(text: str, where: str, client_ids: Iterable[int]) -> int:
    """The client id ``text`` names, when written as its canonical decimal string (so
    ``00``, ``+0``, `` 1``, ``0_0`` or ``٢`` cannot bind client 0, 1 or 2 a second time)."""
    if CANONICAL_ID.fullmatch(text) is None:
        raise ConfigError(
            f"{where}: {text!r} is not a client id; write it in plain decimal digits "
            '(no sign, space, underscore or leading zero), e.g. 0 = "keys/node-0.pub"'
        )
    cid = int(text)
    if cid not in client_ids:
        raise ConfigError(f"{where}: {cid} is not a client of this task")
    return cid


def load_client_keys(path: str | Path, client_ids: list[int]) -> ClientKeys:
    """The bindings of the ``client-keys`` file ``path``: every client of the task must be
    bound, each to a key file or a node id, and no key or node to two clients; anything
    else is a ConfigError naming the file (the run stops before its first round)."""
    path = Path(path)
    raw = read_bytes_bounded(path, MAX_TOML_BYTES, ConfigError, "client-keys file")
    table: dict[str, Any] = parse_toml(raw, ConfigError, f"client-keys file {path}")
    lines = key_lines(raw)
    keys: dict[int, bytes] = {}
    node_ids: dict[int, int] = {}
    for text, value in table.items():
        where = f"client-keys file {path}"
        if text in lines:
            where += f" line {lines[text]}"
        cid = _client_id(text, where, client_ids)
        if isinstance(value, int) and not isinstance(value, bool):
            if value not in NODE_IDS:
                raise ConfigError(
                    f"{where}: client {cid} = {value}; a node id is from {NODE_IDS.start} to "
                    "2**64 - 1 (the ids a SuperLink issues, see `flwr supernode list`)"
                )
            node_ids[cid] = value
        elif isinstance(value, str) and value:
            key_file = path.parent / value
            key = read_bytes_bounded(key_file, MAX_KEY_BYTES, ConfigError, "public key file")
            keys[cid] = public_key_der(key, f"{where}: {key_file}")
        else:
            raise ConfigError(
                f"{where}: client {cid} = {value!r}; give a public key file or a node id"
            )
    missing = [c for c in client_ids if c not in keys and c not in node_ids]
    if missing:
        raise ConfigError(
            f"client-keys file {path} binds no node to clients {missing}; bind every client"
        )
    for what, bound in (("key", keys), ("node id", node_ids)):
        values = list(bound.values())
        twice = {v for v in values if values.count(v) > 1}
        if twice:
            clients = sorted(c for c, v in bound.items() if v in twice)
            raise ConfigError(f"client-keys file {path} binds one {what} to clients {clients}")
    return ClientKeys(keys=keys, node_ids=node_ids)
