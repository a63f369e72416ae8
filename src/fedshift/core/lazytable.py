"""A registry whose built-in entries are imported on first read: :class:`LazyTable`.

The algorithms and the protocols live in modules that import torch; their registries name
each built-in by ``module:attribute`` (as ``models/cards.py``'s ``Builder`` names a model's
builder), so listing the names (``fedshift list algorithms``, the ``protocol`` run key's help)
imports nothing, and reading an entry imports its module then.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any


class LazyTable(MutableMapping):
    """Name -> object: the built-ins (``builtins``: name -> ``module:attribute``, the module
    relative to ``package``), each imported the first time it is read, then whatever is set.

    Iterating gives the built-ins' names in their order, then the others, importing nothing.
    Deleting a built-in's name (or :meth:`clear`) only forgets what was read or set for it:
    the built-in stays. A subclass looks up a name that is not held in :meth:`find`."""

    def __init__(self, package: str, builtins: Mapping[str, str]) -> None:
        self._package = package
        self._builtins = dict(builtins)
        self._held: dict[str, Any] = {}

    def known(self, name: object) -> bool:
        """Whether ``name`` is a built-in or held already (nothing else is looked up)."""
        return name in self._builtins or name in self._held

    def loaded(self, name: object) -> bool:
        """Whether the entry ``name`` is held (a built-in's module imported, or set)."""
        return name in self._held

    def load_builtin(self, name: str) -> Any:
        """Built-in ``name``'s object, importing its module (not kept: see ``table[name]``)."""
        module, _, attribute = self._builtins[name].partition(":")
        return getattr(importlib.import_module(f"{self._package}.{module}"), attribute)

    def find(self, name: str) -> Any:
        """The entry for a name that is neither built in nor held; KeyError here."""
        raise KeyError(name)

    def __getitem__(self, name: str) -> Any:
        if name in self._held:
            return self._held[name]
        value = self.load_builtin(name) if name in self._builtins else self.find(name)
        self._held[name] = value
        return value

    def __setitem__(self, name: str, value: Any) -> None:
        self._held[name] = value

    def __delitem__(self, name: str) -> None:
        if name in self._builtins:
            self._held.pop(name, None)
        else:
            del self._held[name]

    def __iter__(self) -> Iterator[str]:
        yield from self._builtins
        yield from (name for name in self._held if name not in self._builtins)

    def __len__(self) -> int:
        return len(self._builtins) + sum(name not in self._builtins for name in self._held)

    def __contains__(self, name: object) -> bool:
        return self.known(name)

    def clear(self) -> None:
        self._held.clear()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(self)})"
