"""The load-sensitive Flower tests beside a CPU-bound load, several times in a row.

Starts ``--busy`` Python busy loops (each takes a whole core), then runs pytest on the given
test files (default: the two that failed on a loaded 2-core machine in issue 35,
``test_flower_orphans.py`` and ``test_flower_resident.py``) ``--repeats`` times in a row,
each try with a fresh temp folder, so every try starts its own SuperLink, SuperNodes and
workers and builds its own digits-dg cache. Prints one line per try (pytest's outcome,
wall seconds, load average before and after) and exits 1 if any try failed; each try's
pytest output is kept in ``--logs``, and a failed try's temp folder (the Flower logs) too.
The busy loops are stopped at the end, whatever happens.

    python benchmarks/tools/flower_under_load.py [--busy 2] [--repeats 5] [--logs DIR] [TEST ...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUSY_LOOP = "while True: pass"
REPO = Path(__file__).resolve().parents[2]
DEFAULT_TESTS = [
    "tests/engine/flower/test_flower_orphans.py",
    "tests/engine/flower/test_flower_resident.py",
]


def load() -> str:
    return " ".join(f"{value:.1f}" for value in os.getloadavg())


def outcome(output: str) -> str:
    """pytest's closing line ("3 passed in 61.2s"), without the ``=`` rule around it."""
    lines = [line.strip("= ") for line in output.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tests", nargs="*", default=DEFAULT_TESTS, help="test files or ids")
    parser.add_argument("--busy", type=int, default=2, help="busy loops beside the tests")
    parser.add_argument("--repeats", type=int, default=5, help="tries in a row")
    parser.add_argument("--logs", type=Path, default=None, help="folder for each try's output")
    args = parser.parse_args()
    logs = args.logs or Path(tempfile.mkdtemp(prefix="flower-under-load-"))
    logs.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} cores, {args.busy} busy loops, {args.repeats} tries; logs in {logs}")
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(args.busy)]
    failed = 0
    try:
        for attempt in range(1, args.repeats + 1):
            before = load()
            started = time.monotonic()
            basetemp = logs / f"try-{attempt}"
            command = [
                sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                "--basetemp", str(basetemp), *args.tests,
            ]  # fmt: skip
            done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
            seconds = time.monotonic() - started
            (logs / f"try-{attempt}.log").write_text(done.stdout + done.stderr)
            failed += done.returncode != 0
            if done.returncode == 0:
                shutil.rmtree(basetemp, ignore_errors=True)
            print(
                f"try {attempt}: exit {done.returncode}, {outcome(done.stdout)}; "
                f"{seconds:.0f} s wall, load average {before} before, {load()} after",
                flush=True,
            )
    finally:
        for process in busy:
            process.kill()
            process.wait()
    print(f"{args.repeats - failed} of {args.repeats} tries passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
