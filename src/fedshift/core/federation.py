"""Federation: the one door between a server program and its clients."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fedshift.core.record import Record

#: ``(client id, reply) -> None``: what a server program folds each kept reply into as it
#: arrives (e.g. a running mean); it may take arrays out of the reply once folded
ReplyFold = Callable[[int, Record], None]


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
        self,
        task: str,
        ids: Sequence[int],
        record: Record | Mapping[int, Record],
        fold: ReplyFold | None = None,
    ) -> dict[int, Record]:
        """Run client task ``task`` on ``ids`` with ``record`` (one for all, or one per id).

        With ``fold``, every reply that is returned is first passed to ``fold``, once, in
        the order of ``ids``, as soon as it is known to be kept (an engine may do so while
        later clients still run, so the server never holds all of them); the returned
        replies are what ``fold`` left of them. An engine that cannot stream folds them
        all before returning (:func:`fold_all`).
        """


def fold_all(replies: dict[int, Record], fold: ReplyFold | None) -> dict[int, Record]:
    """``fold`` applied to every reply in order (for engines that hold all replies anyway)."""
    if fold is not None:
        for cid, reply in replies.items():
            fold(cid, reply)
    return replies
