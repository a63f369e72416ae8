"""fedshift: federated learning under domain shift.

The public API (see docs/library.md): :func:`run`, :func:`plan`, :func:`sweep`,
:func:`load_run`, :func:`load_preset` and :func:`preset_names` (paper presets), and
:func:`register_model`, :func:`register_dataset`, :func:`register_algorithm` for a script's
own parts. They are imported on first use, so
``import fedshift`` (and the command line) stays quick.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fedshift.core import numerics
from fedshift.core.version import __version__

# torch's CPU libraries read their kernel choice once, at their first kernel: set the pinned
# path's variables before anything computes (FEDSHIFT_CPU_NUMERICS=native leaves them)
numerics.pin_at_import()

if TYPE_CHECKING:
    from fedshift.api import (
        Preset,
        RunResult,
        SweepFailed,
        Task,
        load_preset,
        load_run,
        plan,
        preset_names,
        register_algorithm,
        register_dataset,
        register_model,
        run,
        sweep,
    )

__all__ = [
    "Preset",
    "RunResult",
    "SweepFailed",
    "Task",
    "__version__",
    "load_preset",
    "load_run",
    "plan",
    "preset_names",
    "register_algorithm",
    "register_dataset",
    "register_model",
    "run",
    "sweep",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("fedshift.api"), name)
    raise AttributeError(f"module 'fedshift' has no attribute {name!r}")
