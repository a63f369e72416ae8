"""Client states saved on the SuperNode's own disk, so a resumed run continues them.

Flower keeps ``Context.state`` for one run only; ``resume=true`` starts a new Flower run
whose contexts are empty. After every client task the ClientApp therefore also writes the
client's state to ``<state-dir>/<run token>/client-<id>/round-<r>.pt`` (atomic, no pickle).
When a message of a resumed run reaches a context that has not seen this run token, the
client restores the newest snapshot of a round *before* the message's round: the server
resumes after its last completed round, so a snapshot written in the round it was killed in
is ignored. Personal models and other client state never leave the node.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedshift.core.state import CHECKPOINT_FORMAT, atomic_save, load_checkpoint
from fedshift.data.digits import default_cache_dir

#: snapshots kept per client: the newest one of the round in progress and the one before
KEEP = 2
_SNAPSHOT = re.compile(r"round-(\d+)\.pt")


def state_root(node_config: Mapping[str, Any]) -> Path:
    """Node config ``state-dir``, else ``<dataset cache>/flower-client-state``."""
    configured = str(node_config.get("state-dir", ""))
    if configured:
        return Path(configured)
    cache = str(node_config.get("cache-dir", "")) or os.environ.get("FEDSHIFT_CACHE", "")
    return (Path(cache) if cache else default_cache_dir()) / "flower-client-state"


class NodeSnapshots:
    """The saved states of one client of one fedshift run on this node."""

    def __init__(self, root: Path, run_token: str, client_id: int):
        if not re.fullmatch(r"[0-9a-f]{8,64}", run_token):
            raise ValueError(f"bad run token {run_token!r}")
        self.folder = Path(root) / run_token / f"client-{int(client_id)}"

    def rounds(self) -> list[int]:
        if not self.folder.is_dir():
            return []
        found = (_SNAPSHOT.fullmatch(p.name) for p in self.folder.iterdir())
        return sorted(int(m.group(1)) for m in found if m)

    def save(self, round_: int, state: dict[str, Any]) -> None:
        """Write the state after a task of ``round_``; keep the newest :data:`KEEP` rounds."""
        snapshot = {"format": CHECKPOINT_FORMAT, "round": round_, "client_state": state}
        atomic_save(snapshot, self.folder / f"round-{round_:06d}.pt")
        for old in self.rounds()[:-KEEP]:
            (self.folder / f"round-{old:06d}.pt").unlink(missing_ok=True)

    def latest_before(self, round_: int) -> dict[str, Any]:
        """The state saved in the newest round before ``round_`` (empty if none)."""
        earlier = [r for r in self.rounds() if r < round_]
        if not earlier:
            return {}
        return dict(load_checkpoint(self.folder / f"round-{earlier[-1]:06d}.pt")["client_state"])
