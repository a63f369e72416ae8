"""Fingerprint short runs of every algorithm through the CLI, to prove a refactor changes no number.

Runs ``fedshift run`` for 2 rounds per case on digits-dg (target optdigits where the
protocol has one; each algorithm in its first protocol, plus the segmentation and
personalized variants), then records every number of ``metrics.jsonl`` except timings,
the summary's accuracies and a sha256 over the final checkpoint's server and client tensors.
``--compare OLD.json`` prints the cases whose fingerprint differs: a number of OLD changed or
gone; keys the new runs add (a new summary figure) are listed beside ``same``.

    python benchmarks/tools/fingerprint.py --out runs/fp-old --json old.json
    python benchmarks/tools/fingerprint.py --out runs/fp-new --json new.json --compare old.json

Uses only the command line and ``torch.load(weights_only=True)``, so it runs unchanged
before and after a change of the package's internals.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

COMMON = [
    "--rounds", "2", "--device", "cpu",
    "--set", "threads=1", "--set", "client_data_fraction=0.2",
]  # fmt: skip
#: extra flags per case; a case runs ``fedshift run -a ALGO`` with COMMON + these
CASES: dict[str, tuple[str, list[str]]] = {
    "fedavg": ("fedavg", []),
    "fedprox": ("fedprox", []),
    "local": ("local", []),
    "centralized": ("centralized", []),
    "ditto": ("ditto", []),
    "moon": ("moon", []),
    "fedproto": ("fedproto", []),
    "bd-fedproto": ("bd-fedproto", []),
    "fpl": ("fpl", ["--protocol", "per-domain"]),
    "fedsr": ("fedsr", []),
    "ccst": ("ccst", []),
    "feddg-elcfs": ("feddg-elcfs", []),
    "fedga": ("fedga", []),
    "fedadg": ("fedadg", []),
    "fada": ("fada", ["--protocol", "msst"]),
    "fact": ("fact", ["--protocol", "msst"]),
    "fact-nf": ("fact-nf", ["--protocol", "msst"]),
    "perada": (
        "perada",
        ["-s", "mnist,mnistm", "--set", "server_data=syn", "--set", "algo.kd_steps=20"],
    ),
    "fedavg-segmentation": ("fedavg", ["--set", "problem=segmentation", "--model", "unet"]),
    "elcfs-segmentation": ("feddg-elcfs", ["--set", "problem=segmentation", "--model", "unet"]),
    "fedproto-personalized": (
        "fedproto",
        ["--protocol", "personalized", "--partition", "nway-kshot", "--set", "shots=20"],
    ),
    # client-level DP: DP-FedAvg's model release and FedProto's prototype release
    "fedavg-dp": ("fedavg", ["--set", "dp_clip=1.0", "--set", "dp_noise=0.5"]),
    "fedproto-dp": ("fedproto", ["--set", "dp_clip=1.0", "--set", "dp_noise=0.5"]),
    "ditto-personalized": (
        "ditto",
        ["--protocol", "personalized", "--partition", "dirichlet", "--clients-per-domain", "2"],
    ),
}
TIMING_KEYS = {"seconds", "wall_seconds", "cpu_seconds", "samples_per_second"}
#: summary keys renamed since (old name -> new name)
RENAMED = {"task": "problem"}


def tensor_digest(obj, digest) -> None:
    """Feed every tensor of a nested checkpoint structure into ``digest`` in a fixed order."""
    if isinstance(obj, torch.Tensor):
        digest.update(str(obj.dtype).encode() + str(tuple(obj.shape)).encode())
        digest.update(
            obj.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        )
    elif isinstance(obj, dict):
        for key in sorted(obj, key=str):
            digest.update(str(key).encode())
            tensor_digest(obj[key], digest)
    elif isinstance(obj, list | tuple):
        for item in obj:
            tensor_digest(item, digest)


def strip_timings(obj):
    if isinstance(obj, dict):
        return {k: strip_timings(v) for k, v in obj.items() if k not in TIMING_KEYS}
    if isinstance(obj, list):
        return [strip_timings(v) for v in obj]
    return obj


def fingerprint(run_dir: Path) -> dict:
    history = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    ckpt = torch.load(run_dir / "checkpoint.pt", weights_only=True)
    digest = hashlib.sha256()
    tensor_digest({"server": ckpt["server"], "clients": ckpt["clients"]}, digest)
    return {
        "history": strip_timings(history),
        "summary": strip_timings(summary),
        "state_sha256": digest.hexdigest(),
    }


def added_keys(old: dict, new: dict) -> set[str] | None:
    """The summary and metrics keys ``new`` adds to ``old`` when every number ``old`` holds
    is the same in ``new`` (a refactor may add a figure, never change one); None otherwise."""
    if old["state_sha256"] != new["state_sha256"] or len(old["history"]) != len(new["history"]):
        return None
    added: set[str] = set()
    pairs = [(old["summary"], new["summary"]), *zip(old["history"], new["history"], strict=True)]
    for was, now in pairs:
        if any(key not in now or now[key] != value for key, value in was.items()):
            return None
        added |= set(now) - set(was)
    return added


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the run directories")
    parser.add_argument("--json", type=Path, required=True, help="where to write fingerprints")
    parser.add_argument("--compare", type=Path, help="fingerprints of an earlier run to compare")
    parser.add_argument("--only", default="", help="comma-separated case names (default: all)")
    args = parser.parse_args()
    only = [c for c in args.only.split(",") if c]
    unknown = [c for c in only if c not in CASES]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; choose from: {', '.join(CASES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    backbone = args.out / "backbone-syn.pt"
    if not backbone.exists():
        subprocess.run(
            ["fedshift", "pretrain", "--domain", "syn", "--epochs", "1", "--out", str(backbone)],
            check=True,
        )
    results = {}
    for case, (algorithm, extra) in CASES.items():
        if only and case not in only:
            continue
        run_dir = args.out / case
        if not (run_dir / "summary.json").exists():
            if case == "perada":
                extra = [*extra, "--set", f"algo.backbone={backbone}"]
            if "--protocol" not in extra or "msst" in extra:
                extra = [*extra, "-t", "optdigits"]
            command = ["fedshift", "run", "-a", algorithm, *COMMON, *extra, "--out", str(run_dir)]
            start = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{case}: FAILED\n{done.stderr[-2000:]}", file=sys.stderr)
                return 1
            print(f"{case}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
        results[case] = fingerprint(run_dir)
    args.json.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    if args.compare:
        old = json.loads(args.compare.read_text())
        for fp in old.values():  # summaries written before run keys were renamed
            fp["summary"] = {RENAMED.get(k, k): v for k, v in fp["summary"].items()}
        added = {c: added_keys(old[c], results[c]) for c in results if c in old}
        differ = [c for c in results if c in old and added[c] is None]
        missing = [c for c in results if c not in old]
        for case in results:
            status = "DIFFERS" if case in differ else "missing" if case in missing else "same"
            acc = results[case]["summary"].get("target_accuracy")
            new_keys = f" (adds {', '.join(sorted(added[case]))})" if added.get(case) else ""
            print(
                f"{case:24s} {status:8s} target_accuracy={acc} "
                f"{results[case]['state_sha256'][:16]}{new_keys}"
            )
        return 1 if differ or missing else 0
    for case, fp in results.items():
        acc = fp["summary"].get("target_accuracy")
        print(f"{case:24s} target_accuracy={acc} {fp['state_sha256'][:16]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
