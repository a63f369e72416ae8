"""The speed cost of the pinned CPU numeric path: the same short run on the pinned and the
native path, interleaved, in CPU-seconds of the child process.

    python benchmarks/speed/numeric_path_cost.py [--repeats 3] [--case digits|lite0]

Each repeat runs the case once per path, alternating which goes first, and prints the
CPU-seconds of each and the ratio pinned / native; the last line is the median ratio and the
machine's CPU kind (``avx2`` machines lose only MKL's processor-specific GEMM; an AVX-512
machine also gives up ATen's and oneDNN's wider kernels, so measure there too).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: the cases: the README's main job's setting, shortened; a depthwise-conv backbone
CASES = {
    "digits": [
        "-a", "fedavg", "-t", "mnistm", "--rounds", "1", "--set", "client_data_fraction=0.3",
    ],
    "lite0": [
        "-a", "fedavg", "-t", "mnistm", "--rounds", "1", "--model", "efficientnet-lite0",
        "--set", "client_data_fraction=0.05",
    ],
}  # fmt: skip


def child_cpu_seconds(argv: list[str]) -> float:
    """CPU-seconds (user + system) of one child run of ``argv``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"failed: {' '.join(argv)}\n{done.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def cpu_kind(run_dir: Path) -> str:
    info = json.loads((run_dir / "config.json").read_text())["run_info"]["numerics"]
    return info["cpu_kind"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--case", choices=sorted(CASES), default="digits")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    ratios, kind = [], "?"
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            order = ("pinned", "native") if repeat % 2 == 0 else ("native", "pinned")
            seconds = {}
            for mode in order:
                out = Path(tmp) / f"{mode}-{repeat}"
                argv = ["fedshift", "run", *CASES[args.case], "--device", "cpu", "--quiet"]
                argv += ["--set", "threads=1", "--set", f"cpu_numerics={mode}", "--out", str(out)]
                seconds[mode] = child_cpu_seconds(argv)
                kind = cpu_kind(out)
            ratios.append(seconds["pinned"] / seconds["native"])
            print(
                f"repeat {repeat + 1}: pinned {seconds['pinned']:.1f} CPU-s, native "
                f"{seconds['native']:.1f} CPU-s, ratio {ratios[-1]:.3f}",
                flush=True,
            )
    print(
        f"{args.case}: pinned / native CPU-seconds, median of {len(ratios)}: "
        f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}) "
        f"on an {kind} CPU, {os.cpu_count()} cores"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
