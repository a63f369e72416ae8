"""Where and how a run computes: its device, the CPU threads torch uses, mixed
precision, the channels_last layout and torch.compile, each resolved from the run's
config before any work (a missing prerequisite is one line, exit 2)."""

from __future__ import annotations

import torch

from fedshift.core import numerics
from fedshift.core.context import MixedPrecision
from fedshift.core.errors import ConfigError
from fedshift.core.runconfig import RunConfig


def resolve_device(name: str) -> torch.device:
    """The run key ``device``: auto is CUDA where available, else the CPU; a CUDA device
    this machine lacks is a ConfigError."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "device 'cuda' requested but CUDA is not available; use --device cpu or auto"
        )
    if name.startswith("cuda:"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if int(name[5:]) >= count:
            raise ConfigError(
                f"device {name!r} requested but this machine has {count} CUDA device(s); "
                "use cuda:0 .. cuda:N-1, cuda, cpu or auto"
            )
    return torch.device(name)


def resolve_precision(
    name: str, device: torch.device, cpu_numerics: str = numerics.NATIVE
) -> MixedPrecision:
    """The run key ``precision`` on ``device``: auto is bf16 on a CUDA device that supports
    it, fp32 elsewhere. Half precision on the CPU runs the CPU's own bf16/fp16 kernels, so
    the pinned numeric path refuses it (one line)."""
    if name == "auto":
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        name = "bf16" if bf16 else "fp32"
    if device.type == "cpu" and name != "fp32" and cpu_numerics == numerics.PINNED:
        raise ConfigError(
            f"precision={name} on the CPU runs the CPU's own {name} kernels, which the pinned "
            "numeric path excludes: add --set cpu_numerics=native (numbers then hold on this "
            "CPU kind only), or use precision=fp32"
        )
    return MixedPrecision(name, device.type)


def set_numeric_path(cfg: RunConfig) -> dict:
    """Put this process on the run's CPU numeric path (``cpu_numerics``) before its first
    tensor; what ``config.json`` records of it (:func:`fedshift.core.numerics.describe`)."""
    return numerics.apply(cfg.cpu_numerics)


def uses_channels_last(mode: str, device: torch.device, model: torch.nn.Module) -> bool:
    """Whether the run keeps ``model`` in channels_last memory format: ``on``, or ``auto``
    for a convolutional model on CUDA (cuDNN's fast layout) and on the CPU for a model that
    asks for it (``cpu_channels_last``: the EfficientNet-Lite backbones, 1.65-1.70x faster
    there); never for a model without a 2-d convolution."""
    convolutional = any(isinstance(m, torch.nn.Conv2d) for m in model.modules())
    if mode == "auto":
        preferred = device.type == "cuda" or getattr(model, "cpu_channels_last", False)
        return convolutional and preferred
    return convolutional and mode == "on"


def compile_problem(device: torch.device) -> str | None:
    """Why ``compile=true`` cannot run on ``device`` (None: it can): torch.compile's default
    backend (inductor) generates C++ on the CPU, so it needs a C++ compiler there, and
    Triton kernels on CUDA. Checked at startup so that a missing toolchain is one line
    before any work, not a traceback in the first client's training step."""
    import torch._dynamo

    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile is not supported on this Python/platform"
    if device.type == "cuda":
        from torch.utils._triton import has_triton

        return None if has_triton() else "torch.compile on CUDA needs Triton, not installed"
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception:  # inductor raises InvalidCxxCompiler; any failure means the same
        return "torch.compile on the CPU needs a C++ compiler (g++, or $CXX): none found"
    return None


def check_compile(cfg: RunConfig, device: torch.device) -> None:
    """``compile=true``'s prerequisites on the run's device, or a ConfigError (exit 2)."""
    if not cfg.compile:
        return
    problem = compile_problem(device)
    if problem:
        raise ConfigError(f"compile=true: {problem}; run with --set compile=false")


#: the CPU threads of ``threads=0`` (the default): one, whatever the machine's cores and
#: load. Float results depend on the thread count, so a count chosen from the load (the
#: rule before) gave the same command other numbers on a busy machine than on an idle one;
#: and a thread per core beside a busy process made every parallel region wait for the
#: thread sharing its core (the main job 6x slower on 2 cores). ``threads=N`` sets N.
DEFAULT_THREADS = 1


def run_threads(threads: int) -> int:
    """The CPU threads of a run whose config says ``threads`` (0: :data:`DEFAULT_THREADS`)."""
    return threads if threads > 0 else DEFAULT_THREADS


def set_run_threads(threads: int) -> int:
    """Set torch's CPU threads for a run whose config says ``threads``; the count set."""
    count = run_threads(threads)
    torch.set_num_threads(count)
    return count
