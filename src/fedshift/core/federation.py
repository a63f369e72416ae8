"""Federation: the one door between a server program and its clients."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from fedshift.core.record import Record


class Federation(ABC):
    """What a server program may do: sample clients and call their tasks.

    Engines implement it (in-process simulation, Flower). ``call`` returns the replies
    of the clients that succeeded, keyed by client id, in the order of ``ids``.
    """

    round: int = 0
    total_rounds: int = 1
    server_data: Any = None

    @abstractmethod
    def clients(self, role: str = "source") -> list[int]:
        """Ids of all clients with ``role`` (``source``, ``target`` or ``all``)."""

    @abstractmethod
    def sample(self, k: int | None = None, role: str = "source") -> list[int]:
        """Ids of the clients taking part in this round (seeded; all when ``k`` is None)."""

    @abstractmethod
    def call(
        self, task: str, ids: Sequence[int], record: Record | Mapping[int, Record]
    ) -> dict[int, Record]:
        """Run client task ``task`` on ``ids`` with ``record`` (one for all, or one per id)."""
