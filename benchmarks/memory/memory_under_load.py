"""Peak memory of a run against the size of its client state (issue 23, "memory under load").

Runs Ditto (a personal model in every client's state) on digits-dg with many clients in a
subprocess through the command line, then prints the subprocess's peak RSS
(``getrusage(RUSAGE_CHILDREN).ru_maxrss``) beside the bytes of all clients' persistent
state in the final checkpoint, and their ratio. The state a run must hold is one copy of
the client states; what a round adds on top (replies, copies kept to undo a failed round,
the checkpoint being written) shows in the ratio.

    python benchmarks/memory/memory_under_load.py                # 150 clients, 2 rounds
    python benchmarks/memory/memory_under_load.py --clients 600  # the issue's scale

Uses only the command line and ``torch.load(weights_only=True)``, so it measures an older
checkout the same way (``PYTHONPATH=/path/to/old/src python benchmarks/...``). Run it alone:
other jobs on the machine change the timings, not the memory.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

#: digits-dg's source domains when the target is mnistm (the default): clients are split evenly
SOURCE_DOMAINS = 3


def state_bytes(obj) -> int:
    """Bytes of every tensor in a nested structure of dicts, lists and tensors."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(state_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(state_bytes(v) for v in obj)
    return 0


def command(args: argparse.Namespace, out: Path) -> list[str]:
    per_domain = max(1, args.clients // SOURCE_DOMAINS)
    return [
        sys.executable, "-m", "fedshift.cli", "run", "-a", args.algorithm,
        "--clients-per-domain", str(per_domain), "--rounds", str(args.rounds),
        "--device", "cpu", "--quiet", "--set", "threads=1",
        # personal models are scored once at the end, not every round
        "--set", f"eval_every={args.rounds}",
        *args.extra, "--out", str(out),
    ]  # fmt: skip


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=150, help="clients (default 150)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (default 2)")
    parser.add_argument("--algorithm", default="ditto", help="algorithm (default ditto)")
    parser.add_argument("--out", type=Path, help="run directory (default: a temp folder)")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("extra", nargs="*", help="more `fedshift run` flags (after --)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fedshift-memory-") as tmp:
        out = args.out or Path(tmp) / "run"
        argv = command(args, out)
        print("$", " ".join(argv), file=sys.stderr)
        start = time.perf_counter()
        done = subprocess.run(argv, env=os.environ.copy())
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            print(f"the run failed (exit {done.returncode})", file=sys.stderr)
            return 1
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
        checkpoint = out / "checkpoint.pt"
        saved = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
        clients = state_bytes(saved["clients"])
        figures = {
            "algorithm": args.algorithm,
            "clients": len(saved["clients"]),
            "rounds": args.rounds,
            "peak_rss_bytes": peak,
            "client_state_bytes": clients,
            "checkpoint_bytes": checkpoint.stat().st_size,
            "peak_over_state": round(peak / clients, 2) if clients else None,
            "seconds": round(seconds, 1),
        }
    print(
        f"{figures['algorithm']}, {figures['clients']} clients, {args.rounds} rounds: "
        f"peak RSS {gib(peak)} for {gib(clients)} of client state "
        f"(ratio {figures['peak_over_state']}; checkpoint {gib(figures['checkpoint_bytes'])}; "
        f"{seconds:.0f} s)"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
