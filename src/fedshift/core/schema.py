"""Reply schemas: which arrays a client task may send back, with their shapes and dtypes.

An algorithm declares, per task, what an honest reply holds (:meth:`Algorithm.reply_schema`);
the federation refuses any other reply before the algorithm sees it. A schema maps an array
key to an :class:`ArraySpec`; a key ending in ``.*`` stands for a family of optional keys
under that prefix (e.g. ``prototype.*``: one prototype per class the client holds); a family
may restrict its member names and require the same members as another family (a count for
every prototype).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from fedshift.core.record import Record, share_key


@dataclass(frozen=True)
class ArraySpec:
    """The shape and dtype an array must have.

    ``shape`` None: any shape; a None dimension: any size. Dimensions left open are
    compared across the replies of one call instead (the most common shape wins).
    """

    shape: tuple[int | None, ...] | None
    dtype: torch.dtype
    required: bool = True
    #: for a ``prefix.*`` family: the member names allowed (None: any)
    names: frozenset[str] | None = None
    #: for a ``prefix.*`` family: another family that must hold exactly the same member names
    same_names_as: str | None = None

    def problem(self, key: str, value: torch.Tensor) -> str | None:
        """Why ``value`` does not fit this spec, or None."""
        if value.dtype != self.dtype:
            return f"{key!r} has dtype {value.dtype}, expected {self.dtype}"
        if self.shape is None:
            return None
        shape = tuple(value.shape)
        fits = len(shape) == len(self.shape) and all(
            want is None or got == want for got, want in zip(shape, self.shape, strict=True)
        )
        if not fits:
            expected = ", ".join("*" if d is None else str(d) for d in self.shape)
            if len(self.shape) == 1:
                expected += ","
            return f"{key!r} has shape {shape}, expected ({expected})"
        return None

    @property
    def open(self) -> bool:
        """Whether some dimension is left to the cross-reply comparison."""
        return self.shape is None or any(d is None for d in self.shape)


#: array key (or ``prefix.*``) -> its spec
ReplySchema = dict[str, ArraySpec]


def spec_of(tensor: torch.Tensor, *, required: bool = True) -> ArraySpec:
    """The exact spec of ``tensor``."""
    return ArraySpec(tuple(tensor.shape), tensor.dtype, required)


def specs_of(
    arrays: Mapping[str, torch.Tensor], prefix: str = "", *, required: bool = True
) -> ReplySchema:
    """Exact specs of ``arrays``, keys put under ``prefix.`` when one is given."""
    head = f"{prefix}." if prefix else ""
    return {f"{head}{k}": spec_of(v, required=required) for k, v in arrays.items()}


def echo(sent: Record, *shares: str) -> ReplySchema:
    """The sent arrays of ``shares`` must come back with the same keys, shapes and dtypes."""
    wanted = set(shares)
    return {k: spec_of(v) for k, v in sent.arrays.items() if share_key(k) in wanted}


def family(
    prefix: str,
    shape: tuple[int | None, ...] | None,
    dtype: torch.dtype,
    *,
    names: Iterable[str] | None = None,
    same_names_as: str | None = None,
) -> ReplySchema:
    """Any number of optional arrays ``prefix.<name>`` of one spec; ``names`` limits the
    members, ``same_names_as`` names a family that must hold the same members."""
    allowed = None if names is None else frozenset(names)
    spec = ArraySpec(shape, dtype, required=False, names=allowed, same_names_as=same_names_as)
    return {f"{prefix}.*": spec}


def class_names(num_classes: int) -> frozenset[str]:
    """Member names of a per-class family: ``"0"`` .. ``str(num_classes - 1)``."""
    return frozenset(str(c) for c in range(num_classes))


def lookup(schema: ReplySchema, key: str) -> ArraySpec | None:
    """The spec ``key`` falls under (exact key first, then its ``prefix.*`` family)."""
    found = _lookup(schema, key)
    return None if found is None else found[1]


def _lookup(schema: ReplySchema, key: str) -> tuple[str | None, ArraySpec] | None:
    """(family prefix or None for an exact key, spec) of ``key``."""
    spec = schema.get(key)
    if spec is not None:
        return None, spec
    prefix, dot, _ = key.rpartition(".")
    while dot:
        spec = schema.get(f"{prefix}.*")
        if spec is not None:
            return prefix, spec
        prefix, dot, _ = prefix.rpartition(".")
    return None


def schema_problem(arrays: Mapping[str, torch.Tensor], schema: ReplySchema) -> str | None:
    """Why ``arrays`` do not follow ``schema`` (an unexpected or missing key, a wrong
    shape or dtype), or None."""
    members: dict[str, set[str]] = {}
    for key, value in arrays.items():
        found = _lookup(schema, key)
        if found is None:
            return f"array {key!r} is not part of this task's reply (see reply_schema)"
        prefix, spec = found
        if prefix is not None:
            name = key[len(prefix) + 1 :]
            if spec.names is not None and name not in spec.names:
                return f"array {key!r}: {name!r} is not a member {prefix}.* may hold"
            members.setdefault(prefix, set()).add(name)
        problem = spec.problem(key, value)
        if problem:
            return problem
    for key, spec in schema.items():
        if spec.same_names_as is None:
            continue
        prefix, other = key[:-2], spec.same_names_as
        mine, theirs = members.get(prefix, set()), members.get(other, set())
        if mine != theirs:
            odd = sorted(mine ^ theirs)[0]
            return f"{prefix}.* and {other}.* must hold the same members ({odd!r} is in one only)"
    missing = [k for k, s in schema.items() if s.required and k not in arrays]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        return f"array {missing[0]!r} is missing{more}"
    return None
