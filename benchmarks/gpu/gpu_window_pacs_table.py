"""The GPU window's PACS table: the papers' leave-one-domain-out table, filled cell by cell
over as many windows as it takes.

    python benchmarks/gpu/gpu_window_pacs_table.py TABLE_DIR --data PACS_ROOT --budget SECONDS
        [--methods fedavg,fedga,fedsr,ccst,feddg-elcfs,centralized]
        [--targets art_painting,cartoon,photo,sketch] [--seeds 0,1,2]
        [--device-name NAME] [--commit SHA] [--pack FILE] [--pack-max-mb 15] -- SWEEP_FLAGS...

Runs ``fedshift sweep`` over the methods and targets one seed at a time (seed 0 first) into
``TABLE_DIR`` until ``--budget`` seconds are spent: the sweep reads finished runs back and
resumes an interrupted one from its checkpoint, so the same command in a later window goes
on where this one stopped (the sweep is killed at the budget; a checkpoint is written
atomically after every round). ``SWEEP_FLAGS`` follow ``--`` and go to every sweep (the
GPU window's: ``--model efficientnet-lite0 --set model_weights=imagenet --set
image_size=224 --rounds 30 --device cuda``). ``--data`` should be a path that stays the same
from window to window (``data_root`` is a fixed run key: a resumed run refuses another; the
window gives a fixed symbolic link).

Every cell finished since the last call is appended to ``TABLE_DIR/table.md`` (one row per
run: method, target, seed, rounds, target accuracy at the source-validation round and at the
last round, wall seconds of the run (over all windows), ``--device-name``, ``--commit``, the
time it was recorded), and the pivot of each seed so far (methods x targets, source-validation
choice) is printed. With ``--pack`` the folder is packed into one ``.tgz`` to bring back from
the machine: every run's small files (config, metrics, summary, marker), no ``.lock`` and no
``checkpoint.prev.pt``, no checkpoint of a finished run, and the checkpoint of an unfinished
one only while the archive stays under ``--pack-max-mb`` (the device tool brings back files
of at most 16 MiB); an unfinished run left out starts again from round 1 next time, and the
last line says so. The next window unpacks it into its table folder first
(``gpu_window.sh --table-state FILE``).

The last line printed is the window table's row: cells done per seed, cells finished now.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import time
from datetime import UTC, datetime
from pathlib import Path

METHODS = "fedavg,fedga,fedsr,ccst,feddg-elcfs,centralized"
TARGETS = "art_painting,cartoon,photo,sketch"
TABLE = "table.md"
HEADER = [
    "| run | method | target | seed | rounds | target acc. (source-val) | last round | wall s "
    "| device | commit | recorded (UTC) |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]
#: seconds kept back from the budget for the table and the archive
MARGIN = 15


def finished(table_dir: Path) -> dict[str, dict]:
    """Run-directory name -> summary, for every run with a ``summary.json``."""
    runs = {}
    for path in sorted(table_dir.glob("*/summary.json")):
        try:
            runs[path.parent.name] = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # half-written: the sweep reruns it
    return runs


def recorded(table: Path) -> set[str]:
    """The run names already in the Markdown table."""
    if not table.is_file():
        return set()
    names = set()
    for line in table.read_text().splitlines()[len(HEADER) :]:
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if cells:
            names.add(cells[0])
    return names


def percent(value) -> str:
    return "-" if value is None else f"{100 * float(value):.1f}"


def append_rows(table_dir: Path, device: str, commit: str) -> list[str]:
    """Append a row for every finished run not yet in the table; returns their names."""
    table = table_dir / TABLE
    if not table.is_file():
        table.write_text("\n".join(HEADER) + "\n")
    known = recorded(table)
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    added = []
    rows = []
    for name, s in finished(table_dir).items():
        if name in known:
            continue
        rows.append(
            f"| {name} | {s.get('algorithm')} | {s.get('target')} | {s.get('seed')} "
            f"| {s.get('rounds')} | {percent(s.get('target_accuracy'))} "
            f"(round {s.get('selected_round')}) | {percent(s.get('target_accuracy_last'))} "
            f"| {float(s.get('wall_seconds', 0)):.0f} | {device} | {commit} | {now} |"
        )
        added.append(name)
    if rows:
        with table.open("a") as handle:
            handle.write("\n".join(rows) + "\n")
    return added


def pivot(runs: dict[str, dict], methods: list[str], targets: list[str], seed: int) -> list[str]:
    """Methods x targets of one seed (source-validation choice, %), with the mean of a
    complete row."""
    cells = {
        (s.get("algorithm"), s.get("target")): s.get("target_accuracy")
        for s in runs.values()
        if s.get("seed") == seed
    }
    lines = [
        f"seed {seed}: target accuracy (%), round chosen by source validation",
        "",
        "| method | " + " | ".join(targets) + " | mean |",
        "|---|" + "---|" * (len(targets) + 1),
    ]
    for method in methods:
        values = [cells.get((method, target)) for target in targets]
        mean = "-"
        if all(v is not None for v in values):
            mean = f"{100 * sum(values) / len(values):.1f}"
        lines.append(f"| {method} | " + " | ".join(percent(v) for v in values) + f" | {mean} |")
    return lines


def _archive(table_dir: Path, paths: list[Path]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in paths:
            tar.add(path, arcname=str(path.relative_to(table_dir)))
    return buffer.getvalue()


def pack(table_dir: Path, archive: Path, max_mb: float) -> list[str]:
    """Pack ``table_dir`` as the module docstring says; returns the unfinished runs left out
    because their checkpoint did not fit (they start again from round 1)."""
    done = set(finished(table_dir))
    small, checkpoints = [], []
    for path in sorted(table_dir.rglob("*")):
        if not path.is_file() or path.name in (".lock", "checkpoint.prev.pt"):
            continue
        if path.name.endswith(".tmp") or path.parent == table_dir:
            continue
        run = path.relative_to(table_dir).parts[0]
        if path.name == "checkpoint.pt":
            if run not in done:
                checkpoints.append(path)
            continue
        small.append(path)
    tops = [path for path in sorted(table_dir.iterdir()) if path.is_file()]
    tops = [path for path in tops if not path.name.endswith(".tmp")]
    used = len(_archive(table_dir, tops + small))
    kept, left_out = [], []
    for path in checkpoints:  # checkpoints barely compress: their size is what they add
        if (used + path.stat().st_size) / 2**20 < max_mb:
            used += path.stat().st_size
            kept.append(path)
        else:
            left_out.append(path.parent.name)
    small = [path for path in small if path.relative_to(table_dir).parts[0] not in left_out]
    archive.write_bytes(_archive(table_dir, tops + small + kept))
    return left_out


def run_sweeps(args, sweep_flags: list[str], deadline: float) -> str:
    """One ``fedshift sweep`` per seed until the deadline; returns how the last one ended."""
    for seed in args.seeds:
        left = deadline - time.monotonic()
        if left < 5:
            return "out of time"
        command = [sys.executable, "-m", "fedshift.cli", "sweep", "-d", "pacs"]
        command += ["-a", ",".join(args.methods), "-t", ",".join(args.targets)]
        command += ["--seeds", str(seed), "--set", f"data_root={args.data}"]
        command += [*sweep_flags, "--out", str(args.table_dir), "--quiet"]
        print(f"seed {seed}: {' '.join(command[2:])} (at most {left:.0f} s)", flush=True)
        try:
            done = subprocess.run(command, timeout=left)
        except subprocess.TimeoutExpired:
            return f"stopped at the budget during seed {seed}"
        if done.returncode != 0:
            return f"the sweep of seed {seed} failed (exit {done.returncode})"
    return "every seed done"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    own, sweep_flags = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table_dir", type=Path)
    parser.add_argument("--data", required=True, help="the PACS root (a path fixed across windows)")
    parser.add_argument("--budget", type=float, required=True, help="seconds for the sweeps")
    parser.add_argument("--methods", default=METHODS)
    parser.add_argument("--targets", default=TARGETS)
    parser.add_argument("--seeds", default="0,1,2", help="in this order (seed 0 first)")
    parser.add_argument("--device-name", default="?")
    parser.add_argument("--commit", default="?")
    parser.add_argument("--pack", type=Path, default=None, help="write the folder as this .tgz")
    parser.add_argument("--pack-max-mb", type=float, default=15.0)
    args = parser.parse_args(own)
    args.methods = [m for m in args.methods.split(",") if m]
    args.targets = [t for t in args.targets.split(",") if t]
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.table_dir.mkdir(parents=True, exist_ok=True)
    before = set(finished(args.table_dir))
    ended = run_sweeps(args, sweep_flags, time.monotonic() + max(0.0, args.budget - MARGIN))
    append_rows(args.table_dir, args.device_name, args.commit)
    runs = finished(args.table_dir)
    for seed in args.seeds:
        if any(s.get("seed") == seed for s in runs.values()):
            print("\n".join(["", *pivot(runs, args.methods, args.targets, seed)]))
    print(f"\nevery finished cell: {args.table_dir / TABLE}")
    note = ""
    if args.pack is not None:
        left_out = pack(args.table_dir, args.pack, args.pack_max_mb)
        size = args.pack.stat().st_size / 2**20
        note = f"; packed into {args.pack.name} ({size:.1f} MiB)"
        if left_out:
            note += f", {', '.join(left_out)} left out (its checkpoint is too large): starts again"
    cells = len(args.methods) * len(args.targets)
    done = [sum(1 for s in runs.values() if s.get("seed") == seed) for seed in args.seeds]
    per_seed = ", ".join(f"seed {s}: {d}/{cells}" for s, d in zip(args.seeds, done, strict=True))
    print(
        f"PACS table: {per_seed} cells done, {len(set(runs) - before)} finished in this call "
        f"({ended}){note}"
    )
    return 1 if "failed" in ended else 0


if __name__ == "__main__":
    sys.exit(main())
