"""The CPU's numeric path: which kernels torch's CPU math takes, pinned by default so that
a seed gives the same numbers on every x86-64 machine kind, not only on the kind that made
them.

torch picks its CPU kernels by the processor it finds, in three libraries, each choosing
once, at its first kernel, from an environment variable when one is set:

- ATen's own vectorized kernels (element-wise ops, reductions, losses, the optimizer):
  ``ATEN_CPU_CAPABILITY`` (``default``, ``avx2``, ``avx512``);
- oneDNN's convolutions: ``ONEDNN_MAX_CPU_ISA`` (``AVX2``, ``AVX512_CORE``, ...);
- MKL's matrix products (linear layers, ``addmm``): ``MKL_CBWR``, conditional numerical
  reproducibility. On an AMD processor MKL honours only ``COMPATIBLE`` (its branch for any
  x86-64); a named branch such as ``AVX2`` falls back to ``AUTO``, the processor's own
  (``MKL_VERBOSE=1`` prints ``CNR:AUTO``), so ``COMPATIBLE`` is the one pin that holds on
  this project's AMD EPYC machines.

Measured on an AVX2 machine (digits-dg -> mnistm, FedAvg, round 1): each of the three moves
the last bits of the first round's loss when set to another path, so each is pinned.
``pinned`` (the default) sets ATen to AVX2, oneDNN to at most AVX2 (every machine kind of the
project has both) and MKL to ``COMPATIBLE``; ``native`` leaves all three to torch (faster on
a wider CPU; ``precision=bf16`` on the CPU needs it: bf16 kernels are the CPU's own).

``import fedshift`` (and so the command line) sets the pinned variables before torch
computes anything, unless ``FEDSHIFT_CPU_NUMERICS=native``; a run applies its own
``cpu_numerics`` key before its first tensor. A process whose torch computed on the CPU
before that has its path already: a pinned run then checks ATen's capability and stops with
one line when it is not the pinned one (a native run goes on, on the path the process has,
and records it). MKL's and oneDNN's choice cannot be read back, so a
program should import fedshift before it computes with torch (importing torch first is
fine). Threads (the ``threads`` key) are the fourth part of the path and recorded apart.

Nothing here imports torch at import time.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from fedshift.core.errors import ConfigError

#: the run key's values: pinned (the default) or native
PINNED, NATIVE = "pinned", "native"
MODES = (PINNED, NATIVE)
#: the environment variable that picks the path of a process before any run says
ENV_MODE = "FEDSHIFT_CPU_NUMERICS"
#: what pinned sets: one variable per library, read once by it at its first kernel
PINNED_ENV: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "MKL_CBWR": "COMPATIBLE",
}
#: ATen's capability on the pinned path, as ``torch.backends.cpu.get_cpu_capability()`` says it
PINNED_CAPABILITY = "AVX2"

#: the variables as the process had them before fedshift pinned them (restored by native)
_original_env: dict[str, str | None] = {}
#: the mode this process's variables are set for (None: not yet)
_applied: str | None = None
#: whether torch was imported before fedshift set the variables
_torch_first = False


class NumericPathError(ConfigError):
    """The run's numeric path cannot be had in this process (one line, exit 2)."""


def process_mode() -> str:
    """The path ``FEDSHIFT_CPU_NUMERICS`` asks of this process (pinned when unset or unknown)."""
    mode = os.environ.get(ENV_MODE, PINNED).strip().lower()
    return mode if mode in MODES else PINNED


def set_environment(mode: str) -> None:
    """Set (pinned) or restore (native) the libraries' variables for ``mode``; they take
    effect only if torch has not yet computed on the CPU in this process."""
    global _applied, _torch_first
    if mode not in MODES:
        raise ValueError(f"cpu_numerics must be one of {', '.join(MODES)}, not {mode!r}")
    if _applied is None:
        _torch_first = "torch" in sys.modules
        _original_env.update({name: os.environ.get(name) for name in PINNED_ENV})
    if mode == PINNED:
        os.environ.update(PINNED_ENV)
    else:
        for name, value in _original_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    _applied = mode


def pin_at_import() -> None:
    """What ``import fedshift`` does: set the variables for :func:`process_mode`."""
    if _applied is None:
        set_environment(process_mode())


def expected_capability(mode: str) -> str | None:
    """ATen's capability on ``mode``'s path on this CPU (None: cannot be told, e.g. a
    native path on a non-x86 processor, or a user's own ATEN_CPU_CAPABILITY)."""
    import torch

    if mode == PINNED:
        return PINNED_CAPABILITY if torch.cpu._is_avx2_supported() else None
    if _original_env.get("ATEN_CPU_CAPABILITY"):
        return None
    if torch.cpu._is_avx512_supported():
        return "AVX512"
    return "AVX2" if torch.cpu._is_avx2_supported() else None


def apply(mode: str) -> dict[str, Any]:
    """Put this process on ``mode``'s path before a run's first tensor, check it took and
    return what ``config.json`` records (:func:`describe`). Raises NumericPathError when
    pinned is asked of a process whose torch already computes on another path; native
    promises nothing, so it runs on whatever path the process has (recorded)."""
    set_environment(mode)
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    expected = expected_capability(mode)
    if mode == NATIVE:
        # native pins nothing: a process already on the pinned path runs there (slower on
        # a wide CPU, the same numbers as pinned) and the record says which path was in force
        return describe(mode)
    if expected is not None and capability != expected:
        other = NATIVE if mode == PINNED else PINNED
        raise NumericPathError(
            f"cpu_numerics={mode}: torch in this process already computes on the {other} "
            f"CPU path (ATen capability {capability}, expected {expected}); the path is fixed "
            f"at torch's first CPU kernel: import fedshift before computing with torch, set "
            f"{ENV_MODE}={mode} before starting Python, or run with cpu_numerics={other}"
        )
    if mode == PINNED:
        problem = fast_math_problem()
        if problem:
            raise NumericPathError(f"cpu_numerics=pinned: {problem}")
    return describe(mode)


def fast_math_problem() -> str | None:
    """Why torch's float32 math is not IEEE here (None: it is): oneDNN's or the matmul
    precision set to a faster, lower-precision mode by the program."""
    import torch

    low = {
        "mkldnn matmul": torch.backends.mkldnn.matmul.fp32_precision,
        "mkldnn conv": torch.backends.mkldnn.conv.fp32_precision,
    }
    for name, value in low.items():
        if value not in ("none", "ieee"):
            return f"torch.backends.{name.replace(' ', '.')}.fp32_precision is {value!r}"
    if torch.get_float32_matmul_precision() != "highest":
        return (
            "torch.set_float32_matmul_precision("
            f"{torch.get_float32_matmul_precision()!r}) lowers float32 matmul precision"
        )
    return None


def cpu_kind() -> str:
    """This machine's CPU kind as the numbers depend on it: the widest vector extension
    torch can use (avx512-bf16, avx512, avx2, or the architecture's name)."""
    import platform

    import torch

    if torch.cpu._is_avx512_bf16_supported():
        return "avx512-bf16"
    if torch.cpu._is_avx512_supported():
        return "avx512"
    if torch.cpu._is_avx2_supported():
        return "avx2"
    return platform.machine() or "unknown"


def describe(mode: str | None = None) -> dict[str, Any]:
    """The numeric path in force, as ``config.json``'s ``run_info.numerics`` records it."""
    import torch

    return {
        "cpu_numerics": mode or _applied or process_mode(),
        "cpu_kind": cpu_kind(),
        "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "onednn_max_cpu_isa": os.environ.get("ONEDNN_MAX_CPU_ISA", "native"),
        "mkl_cbwr": os.environ.get("MKL_CBWR", "native"),
        "torch_imported_first": _torch_first,
    }


def summary_line(info: dict[str, Any]) -> str:
    """One line naming a recorded path (``run_info.numerics``), for the end of a run."""
    mode = info.get("cpu_numerics", "?")
    parts = (
        f"ATen {info.get('aten_cpu_capability', '?')}, "
        f"oneDNN {info.get('onednn_max_cpu_isa', '?')}, MKL {info.get('mkl_cbwr', '?')}"
    )
    return f"numeric path {mode} ({parts}) on an {info.get('cpu_kind', '?')} CPU"
