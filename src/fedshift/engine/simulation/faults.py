"""Fault injection for the simulation engine: the run key ``faults``.

``faults`` is a comma-separated list of ``KIND@ROUND:CLIENT`` (``*`` for any round or any
client), e.g. ``faults="raise@2:1,nan@3:*"``. Each names what goes wrong with that client's
reply in that round (every call of the round):

* ``raise``: the client task raises; ``drop``: the reply is lost; ``straggle``: the reply
  comes after the round's deadline on the simulated clock (it is discarded, never used in
  a later round);
* ``nan``, ``huge`` (values ×1e30), ``dtype`` (float arrays as float64), ``int8`` (every
  array as int8 zeros), ``wrong-shape``, ``key-missing``, ``key-extra``: corrupted arrays;
* ``num-examples-huge`` (``num-examples`` claims 10⁹ samples), ``num-examples-string``
  (``num-examples`` as a string).

The names shared with Flower's tampering ClientApp come from
:mod:`fedshift.engine.fault_names`; an old name (``shape``, ``weight``, ...) is refused with
its new name.

The federation's reply validation and failure policy decide what happens next, as they
would with a real broken or hostile client. Node-level faults on Flower live in
:mod:`fedshift.engine.flower.faults`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from fedshift.core.errors import ConfigError
from fedshift.core.record import Record
from fedshift.engine import fault_names as names


class InjectedFault(RuntimeError):
    """The exception a ``raise`` fault makes a client task throw."""


def _map_floats(reply: Record, change: Callable[[torch.Tensor], torch.Tensor]) -> None:
    reply.arrays = {k: change(v) if v.is_floating_point() else v for k, v in reply.arrays.items()}


def _drop_first(reply: Record) -> None:
    if reply.arrays:
        del reply.arrays[next(iter(reply.arrays))]


def _extra_key(reply: Record) -> None:
    share = next(iter(reply.arrays), "model.x").split(".", 1)[0]
    reply.arrays[f"{share}.injected"] = torch.ones(3)


def _wrong_shape(reply: Record) -> None:
    if reply.arrays:
        key = next(iter(reply.arrays))
        reply.arrays[key] = torch.zeros(1, 2, 3, dtype=reply.arrays[key].dtype)


#: corruptions of a reply, applied in place
CORRUPTIONS: dict[str, Callable[[Record], None]] = {
    names.NAN: lambda r: _map_floats(r, lambda v: torch.full_like(v, float("nan"))),
    "huge": lambda r: _map_floats(r, lambda v: v * 1e30 + 1e30),
    "dtype": lambda r: _map_floats(r, lambda v: v.to(torch.float64)),
    names.INT8: lambda r: r.arrays.update(
        {k: torch.zeros_like(v, dtype=torch.int8) for k, v in r.arrays.items()}
    ),
    names.WRONG_SHAPE: _wrong_shape,
    names.KEY_MISSING: _drop_first,
    names.KEY_EXTRA: _extra_key,
    names.NUM_EXAMPLES_HUGE: lambda r: r.metrics.update({"num-examples": 10**9}),
    names.NUM_EXAMPLES_STRING: lambda r: r.metrics.update({"num-examples": "12"}),
}
#: faults about whether and when a reply arrives
DELIVERY = ("raise", "drop", "straggle")
KINDS = (*DELIVERY, *CORRUPTIONS)


@dataclass(frozen=True)
class Fault:
    kind: str
    round: int | None  # None: every round
    client: int | None  # None: every client

    def hits(self, round_: int, cid: int) -> bool:
        return self.round in (None, round_) and self.client in (None, cid)


def parse_faults(text: str) -> list[Fault]:
    """The faults of a ``faults`` run key; a malformed entry is a ConfigError."""
    faults = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        kind, at, where = item.partition("@")
        round_text, colon, client_text = where.partition(":")
        if at and colon and kind not in KINDS:
            raise ConfigError(f"faults entry {item!r}: {names.unknown_fault(kind, KINDS)}")
        if kind not in KINDS or not at or not colon:
            raise ConfigError(
                f"faults entry {item!r} is not KIND@ROUND:CLIENT with KIND one of: "
                f"{', '.join(KINDS)} (ROUND and CLIENT: a number or *)"
            )
        try:
            round_ = None if round_text == "*" else int(round_text)
            client = None if client_text == "*" else int(client_text)
        except ValueError:
            raise ConfigError(
                f"faults entry {item!r}: round and client must be numbers or *"
            ) from None
        faults.append(Fault(kind, round_, client))
    return faults


class FaultPlan:
    """The faults of a run, asked per (round, client)."""

    def __init__(self, faults: list[Fault]):
        self.faults = faults

    @classmethod
    def from_text(cls, text: str) -> FaultPlan | None:
        faults = parse_faults(text)
        return cls(faults) if faults else None

    def kinds(self, round_: int, cid: int) -> list[str]:
        return [f.kind for f in self.faults if f.hits(round_, cid)]
