"""Plug-ins: algorithms, models and datasets from other packages.

A package adds them through entry points (``[project.entry-points."fedshift.algorithms"]``,
``"fedshift.models"``, ``"fedshift.datasets"``), loaded lazily when a name is looked up or
listed; a name may also be an import path ``package.module:attribute``. Every failure is a
:class:`~fedshift.core.errors.ConfigError` of one line naming the plug-in, never a traceback.
"""

from __future__ import annotations

import importlib
import re
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from fedshift.core.errors import ConfigError

#: entry-point group of each kind of plug-in
GROUPS = {
    "algorithm": "fedshift.algorithms",
    "model": "fedshift.models",
    "dataset": "fedshift.datasets",
}

_SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


#: name prefixes that look like an import path but name a library's registry (``timm:resnet18``
#: is timm's resnet18 architecture, built by fedshift; no module of the user's is imported)
LIBRARY_PREFIXES = ("timm:",)


def is_import_path(name: str) -> bool:
    """Whether ``name`` reads ``package.module:attribute`` (not a registry name, and not a
    library's architecture such as ``timm:resnet18``)."""
    return bool(_SPEC.match(name)) and not name.startswith(LIBRARY_PREFIXES)


def load_import_path(spec: str, kind: str) -> Any:
    """The object ``package.module:attribute`` names; a ConfigError naming it otherwise."""
    module_name, _, attribute = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{kind} {spec!r}: cannot import {module_name!r} ({exc})") from None
    except Exception as exc:  # noqa: BLE001 - a third-party module may raise anything on import
        raise ConfigError(
            f"{kind} {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ConfigError(f"{kind} {spec!r}: module {module_name!r} has no {attribute!r}")
        target = getattr(target, part)
    return target


@cache
def _entry_points(group: str) -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for point in entry_points(group=group):
        found.setdefault(point.name, point)
    return found


def plugin_names(kind: str) -> list[str]:
    """Names the installed packages offer for ``kind`` (nothing is imported)."""
    return list(_entry_points(GROUPS[kind]))


def plugin_source(kind: str, name: str) -> str:
    """``distribution (module:attr)`` of a plug-in, for listings and messages."""
    point = _entry_points(GROUPS[kind])[name]
    dist = point.dist.name if point.dist is not None else "?"
    return f"{dist} ({point.value})"


def load_plugin(kind: str, name: str) -> Any | None:
    """The object behind plug-in ``name`` of ``kind``; None when no package offers it.

    A plug-in that fails to import is a ConfigError naming it and its package.
    """
    point = _entry_points(GROUPS[kind]).get(name)
    if point is None:
        return None
    try:
        return point.load()
    except Exception as exc:  # noqa: BLE001 - a third-party module may raise anything on import
        raise ConfigError(
            f"{kind} plug-in {name!r} from {plugin_source(kind, name)} failed to load: "
            f"{type(exc).__name__}: {exc}"
        ) from None


def refresh() -> None:
    """Forget the cached entry points (after installing a package in a running process)."""
    _entry_points.cache_clear()
