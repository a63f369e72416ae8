"""Simulated malicious clients for the simulation engine: the run keys ``attack``,
``attack_clients`` and ``attack_strength``.

Malicious clients compute their honest reply first; the harness then replaces what they
send, in every call, the way :mod:`~fedshift.engine.simulation.faults` corrupts a faulty
client's reply.
Unlike a fault, an attacked reply is well-formed (same keys, shapes and dtypes, finite,
honest metrics) and passes reply validation: the point is that it is malicious. Only the
floating arrays of a ``MODEL`` or ``PROTOTYPE`` share are changed. For a model array the
*update* is the reply minus what the server sent under the same key; a prototype is its own
update (nothing is sent to compare with). With ``s`` = ``attack_strength`` (0 picks the
default given):

* ``sign-flip``: the update is negated and scaled, ``sent − s·(reply − sent)`` (s = 1);
* ``alie`` (Baruch et al., NeurIPS 2019, "A Little Is Enough"): ``sent + μ − z·σ`` with μ, σ
  the coordinate-wise mean and (population) standard deviation of the honest clients'
  updates of this call; z = s, default Baruch's z_max = Φ⁻¹((n − k)/n) with
  k = ⌊n/2 + 1⌋ − m for n clients in the call, m of them malicious;
* ``ipm`` (Xie et al., UAI 2020, inner-product manipulation): ``sent − ε·μ``, ε = s
  (default 0.1, the setting that defeats Krum and the median in the paper);
* ``label-flip``: the client trains on its own images with labels y → C − 1 − y (a
  data-level change of its training split made once, before round 1; replies untouched);
* ``proto-poison``: each class prototype the client sends is replaced by its prototype of
  class C − 1 − c, or of the class at the mirrored position among the classes it holds,
  times s (default 1: swapped classes); a table with one row per class (FedSR's shared
  reference) has its rows mirrored the same way.

"Honest" are the clients of the call that are not malicious (all clients of the call when
every one of them is). ``attack_clients`` is a count N (the N source clients with the
lowest ids) or ``ids:I,J`` (those source clients).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from fedshift.core.context import ClientContext, SplitView
from fedshift.core.errors import ConfigError
from fedshift.core.record import Kind, Record, share_key
from fedshift.core.runconfig import RunConfig
from fedshift.core.split import Split

#: the kinds of share an attack changes
ATTACKED_KINDS = (Kind.MODEL, Kind.PROTOTYPE)
#: attack -> its ``attack_strength`` when the run leaves it 0 (None: computed, ALIE's z_max)
DEFAULT_STRENGTH = {
    "sign-flip": 1.0,
    "alie": None,
    "ipm": 0.1,
    "label-flip": None,
    "proto-poison": 1.0,
}


def parse_attack_clients(text: str, sources: list[int]) -> list[int]:
    """The malicious client ids of an ``attack_clients`` value; ConfigError when malformed."""
    text = text.strip()
    if text.startswith("ids:"):
        try:
            ids = sorted({int(part) for part in text[4:].split(",") if part.strip()})
        except ValueError:
            raise ConfigError(
                f"attack_clients {text!r}: ids:I,J expects client ids (numbers)"
            ) from None
        stray = [cid for cid in ids if cid not in sources]
        if not ids or stray:
            raise ConfigError(
                f"attack_clients {text!r} names no source client"
                + (f" ({stray[0]} is not one)" if stray else "")
                + f"; source clients: {', '.join(map(str, sources))}"
            )
        return ids
    try:
        count = int(text)
    except ValueError:
        raise ConfigError(f"attack_clients must be a count N or ids:I,J, got {text!r}") from None
    if not 1 <= count <= len(sources):
        raise ConfigError(
            f"attack_clients={count} but the run has {len(sources)} source clients; "
            f"choose 1..{len(sources)}"
        )
    return sorted(sources)[:count]


def alie_z(n: int, malicious: int) -> float:
    """Baruch et al.'s z_max for n clients of which ``malicious`` attack."""
    supporters = math.floor(n / 2 + 1) - malicious
    share = (n - supporters) / n
    if not 0 < share < 1:
        return 0.0
    return statistics.NormalDist().inv_cdf(share)


def flip_labels(view: SplitView, num_classes: int) -> SplitView:
    """The view's split with labels y → C − 1 − y (images and masks unchanged)."""
    split = Split(x=view.x, y=(num_classes - 1) - view.y, mask=None)
    return SplitView(split, view.labeled, view.device)


def mirrored_class(label: int, held: list[int], num_classes: int) -> int:
    """Class C − 1 − c when held, else the class at c's mirrored position in ``held``."""
    if num_classes - 1 - label in held:
        return num_classes - 1 - label
    return held[len(held) - 1 - held.index(label)]


@dataclass
class AttackPlan:
    """The run's attack: its kind, the malicious clients and the strength."""

    kind: str
    clients: list[int]
    strength: float | None
    shares: Mapping[str, Kind]
    num_classes: int

    @classmethod
    def from_config(
        cls,
        cfg: RunConfig,
        contexts: Mapping[int, ClientContext],
        shares: Mapping[str, Kind],
        num_classes: int,
    ) -> AttackPlan | None:
        """The attack of ``cfg`` (None without one); ``label-flip`` changes the malicious
        clients' training splits in ``contexts`` here, once."""
        if not cfg.attack:
            return None
        sources = [cid for cid, ctx in contexts.items() if ctx.role == "source"]
        clients = parse_attack_clients(cfg.attack_clients, sources)
        strength = cfg.attack_strength or DEFAULT_STRENGTH[cfg.attack]
        if cfg.attack == "label-flip":
            if cfg.problem != "classification":
                raise ConfigError("attack=label-flip needs problem=classification")
            for cid in clients:
                contexts[cid].train = flip_labels(contexts[cid].train, num_classes)
        if cfg.attack == "proto-poison" and Kind.PROTOTYPE not in shares.values():
            raise ConfigError(
                f"attack=proto-poison needs an algorithm that sends prototypes; "
                f"{cfg.algorithm!r} shares {', '.join(shares)}"
            )
        return cls(cfg.attack, clients, strength, shares, num_classes)

    def attacked_keys(self, reply: Record) -> list[str]:
        return [
            key
            for key, value in reply.arrays.items()
            if self.shares.get(share_key(key)) in ATTACKED_KINDS and value.is_floating_point()
        ]

    def base(self, key: str, sent: Record, value: torch.Tensor) -> torch.Tensor:
        """What an update of ``key`` is measured from: the sent array, else zeros."""
        origin = sent.arrays.get(key)
        if origin is not None and origin.shape == value.shape and origin.is_floating_point():
            return origin.detach().to("cpu", torch.float64)
        return torch.zeros(value.shape, dtype=torch.float64)

    def apply(self, sends: Mapping[int, Record], replies: dict[int, Record]) -> None:
        """Replace the malicious clients' replies of one call in place."""
        if self.kind == "label-flip":
            return
        bad = [cid for cid in replies if cid in self.clients]
        if not bad:
            return
        honest = [cid for cid in replies if cid not in self.clients] or bad
        for cid in bad:
            reply = replies[cid]
            changed = {}
            for key in self.attacked_keys(reply):
                value = reply.arrays[key]
                base = self.base(key, sends[cid], value)
                update = value.detach().to("cpu", torch.float64) - base
                evil = self.malicious_update(key, update, sends, replies, honest, len(bad), reply)
                changed[key] = (base + evil).to(value.dtype)
            reply.arrays.update(changed)

    def malicious_update(
        self,
        key: str,
        update: torch.Tensor,
        sends: Mapping[int, Record],
        replies: Mapping[int, Record],
        honest: list[int],
        malicious: int,
        reply: Record,
    ) -> torch.Tensor:
        """The update a malicious client sends for ``key`` instead of its own ``update``."""
        if self.kind == "sign-flip":
            return -self.strength * update
        if self.kind == "proto-poison":
            if self.shares.get(share_key(key)) != Kind.PROTOTYPE:
                return update
            return self.poisoned_prototype(key, reply)
        others = [
            replies[h].arrays[key].detach().to("cpu", torch.float64)
            - self.base(key, sends[h], replies[h].arrays[key])
            for h in honest
            if key in replies[h].arrays and replies[h].arrays[key].shape == update.shape
        ]
        if not others:
            return update
        stacked = torch.stack(others)
        mean = stacked.mean(dim=0)
        if self.kind == "ipm":
            return -self.strength * mean
        if self.kind == "alie":
            z = self.strength if self.strength is not None else alie_z(len(replies), malicious)
            return mean - z * stacked.std(dim=0, correction=0)
        raise ValueError(f"unknown attack {self.kind!r}")

    def poisoned_prototype(self, key: str, reply: Record) -> torch.Tensor:
        """``strength`` × the reply's prototype of the mirrored class (see the module doc)."""
        share, _, label = key.partition(".")
        try:
            held = sorted(int(k.partition(".")[2]) for k in reply.arrays if share_key(k) == share)
            swapped = mirrored_class(int(label), held, self.num_classes)
        except ValueError:  # one table of all classes (FedSR's reference): rows mirrored
            table = reply.arrays[key].detach().to("cpu", torch.float64)
            if table.dim() >= 1 and table.shape[0] == self.num_classes:
                table = table.flip(0)
            return self.strength * table
        return self.strength * reply.arrays[f"{share}.{swapped}"].detach().to("cpu", torch.float64)
