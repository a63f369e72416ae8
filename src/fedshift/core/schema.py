"""Reply schemas: which arrays a client task may send back, with their shapes and dtypes.

An algorithm declares, per task, what an honest reply holds (:meth:`Algorithm.reply_schema`);
the federation refuses any other reply before the algorithm sees it. A schema maps an array
key to an :class:`ArraySpec`; a key ending in ``.*`` stands for a family of optional keys
under that prefix (e.g. ``prototype.*``: one prototype per class the client holds).
"""

from __future__ import annotations

from collections.abc import Mapping
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


def family(prefix: str, shape: tuple[int | None, ...] | None, dtype: torch.dtype) -> ReplySchema:
    """Any number of optional arrays ``prefix.<name>`` of one spec."""
    return {f"{prefix}.*": ArraySpec(shape, dtype, required=False)}


def lookup(schema: ReplySchema, key: str) -> ArraySpec | None:
    """The spec ``key`` falls under (exact key first, then its ``prefix.*`` family)."""
    spec = schema.get(key)
    if spec is not None:
        return spec
    prefix, dot, _ = key.rpartition(".")
    while dot:
        spec = schema.get(f"{prefix}.*")
        if spec is not None:
            return spec
        prefix, dot, _ = prefix.rpartition(".")
    return None


def schema_problem(arrays: Mapping[str, torch.Tensor], schema: ReplySchema) -> str | None:
    """Why ``arrays`` do not follow ``schema`` (an unexpected or missing key, a wrong
    shape or dtype), or None."""
    for key, value in arrays.items():
        spec = lookup(schema, key)
        if spec is None:
            return f"array {key!r} is not part of this task's reply (see reply_schema)"
        problem = spec.problem(key, value)
        if problem:
            return problem
    missing = [k for k, s in schema.items() if s.required and k not in arrays]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        return f"array {missing[0]!r} is missing{more}"
    return None
