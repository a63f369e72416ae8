"""Training images per CPU-second on this CPU: fp32 against bf16 autocast and channels_last,
per model, measured side by side in one process.

    python benchmarks/speed/cpu_fast_path.py [--models efficientnet-lite0@128,resnet18@128,cnn@32]
                                       [--batch 32] [--steps 6] [--repeats 3] [--threads 1]

Each (model, setting) pair trains ``--steps`` SGD steps (forward under the run's autocast,
cross-entropy, backward, step; the same code path as ``MixedPrecision`` in a run) on a
fixed random batch, after one warm-up step. The settings of one model are interleaved in
every repetition, so a change of the machine's load touches all of them alike; the figure
is the median over repetitions of images / CPU-second (``time.process_time``: this
process's CPU time, so a busy machine inflates it less than wall time), and the ratio to
fp32 of the same model. bf16 is fast only where the CPU has native bf16 (AVX-512 BF16 or
AMX); the first line says whether this one does.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from fedshift.core.context import MixedPrecision
from fedshift.models import build_model

SETTINGS = {
    "fp32": ("fp32", False),
    "channels_last": ("fp32", True),
    "bf16": ("bf16", False),
    "bf16+channels_last": ("bf16", True),
}


def cpu_bf16_native() -> bool:
    """Whether oneDNN runs bf16 natively on this CPU (AVX-512 BF16 or AMX)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check()) if check is not None else False


def _model(spec: str, channels_last: bool) -> tuple[torch.nn.Module, int]:
    name, _, size = spec.partition("@")
    torch.manual_seed(0)
    model = build_model(name, 7, image_size=int(size)).train()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model, int(size)


def images_per_cpu_second(spec: str, setting: str, batch: int, steps: int) -> float:
    precision, channels_last = SETTINGS[setting]
    model, size = _model(spec, channels_last)
    amp = MixedPrecision(precision, "cpu")
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, 3, size, size, generator=g) * 2 - 1
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 7, (batch,), generator=g)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with amp.autocast():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()

    step()  # warm-up: oneDNN picks and caches its kernels
    start = time.process_time()
    for _ in range(steps):
        step()
    return batch * steps / (time.process_time() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="efficientnet-lite0@128,resnet18@128,cnn@32")
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    settings = args.settings.split(",")
    print(
        f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch}, "
        f"{args.steps} steps x {args.repeats} interleaved repetitions; native bf16: "
        f"{cpu_bf16_native()}"
    )
    print(f"| model | {' | '.join(settings)} |")
    print(f"|---|{'---|' * len(settings)}")
    for spec in args.models.split(","):
        runs: dict[str, list[float]] = {s: [] for s in settings}
        for _ in range(args.repeats):
            for setting in settings:
                runs[setting].append(images_per_cpu_second(spec, setting, args.batch, args.steps))
        base = statistics.median(runs["fp32"]) if "fp32" in runs else None
        cells = []
        for setting in settings:
            rate = statistics.median(runs[setting])
            ratio = f" ({rate / base:.2f}x)" if base else ""
            cells.append(f"{rate:.1f}{ratio}")
        print(f"| {spec} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
