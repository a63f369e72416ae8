"""Split a dataset copy into parts that each fit one call to the GPU machine.

One device call carries at most 64 MiB of working tree, and PACS is 205 MB, so the GPU
window's PACS step needs the copy staged over several calls made back to back while the
machine is warm (it is kept 30 s between calls). This script fills ``.stage1``, ``.stage2``,
... in the repository root with hard links (copies where the file system refuses links), each
part at most ``--max-mb`` MB (default 58: 64 MiB less the ~2.5 MB of tracked tree, with a
margin), every file in exactly one part, the relative layout kept, and adds the folders to
``.git/info/exclude`` so they never reach git. It prints the device calls to make:

    python benchmarks/gpu/gpu_stage_pacs.py ../shared/datasets/PACS

then, for part k: carry ``.stagek`` and run ``mkdir -p /tmp/PACS && cp -a .stagek/. /tmp/PACS/``;
the last call also carries ``.whl`` and runs the window with ``--pacs /tmp/PACS`` after checking
the file count this script prints.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PREFIX = ".stage"


def plan_parts(files: list[tuple[Path, int]], max_bytes: int) -> list[list[Path]]:
    """Greedy, in path order: a new part starts when the next file would overflow this one."""
    parts: list[list[Path]] = [[]]
    used = 0
    for path, size in files:
        if size > max_bytes:
            raise ValueError(f"{path} is {size:,} bytes, more than a part may hold ({max_bytes:,})")
        if used + size > max_bytes and parts[-1]:
            parts.append([])
            used = 0
        parts[-1].append(path)
        used += size
    return parts


def place(source: Path, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def exclude(repo: Path, names: list[str]) -> None:
    """Add ``/name/`` lines to the repository's ``info/exclude`` (once each)."""
    found = subprocess.run(
        ["git", "rev-parse", "--git-path", "info/exclude"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    path = Path(found) if Path(found).is_absolute() else repo / found
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = path.read_text().splitlines() if path.is_file() else []
    missing = [f"/{name}/" for name in names if f"/{name}/" not in lines]
    if missing:
        with path.open("a") as handle:
            handle.write("".join(line + "\n" for line in missing))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="the dataset copy (e.g. ../shared/datasets/PACS)")
    parser.add_argument("--max-mb", type=float, default=58.0, help="most MB per part (default 58)")
    parser.add_argument("--repo", type=Path, default=REPO, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        print(f"gpu_stage_pacs.py: {args.root} is not a folder", file=sys.stderr)
        return 2
    if args.max_mb <= 0:
        print(f"gpu_stage_pacs.py: --max-mb must be positive, got {args.max_mb}", file=sys.stderr)
        return 2
    root = args.root.resolve()
    files = sorted((p, p.stat().st_size) for p in root.rglob("*") if p.is_file())
    if not files:
        print(f"gpu_stage_pacs.py: {root} holds no file", file=sys.stderr)
        return 2
    try:
        parts = plan_parts(files, int(args.max_mb * 1e6))
    except ValueError as error:
        print(f"gpu_stage_pacs.py: {error}", file=sys.stderr)
        return 2
    for old in args.repo.glob(f"{PREFIX}*"):
        if old.is_dir():
            shutil.rmtree(old)
    names = [f"{PREFIX}{k}" for k in range(1, len(parts) + 1)]
    exclude(args.repo, names)
    for name, part in zip(names, parts, strict=True):
        for path in part:
            place(path, args.repo / name / path.relative_to(root))
        size = sum(p.stat().st_size for p in part)
        print(f"{name}: {len(part)} files, {size / 1e6:.1f} MB")
    print(f"{len(files)} files in {len(parts)} parts; carry each part in one call, in order")
    return 0


if __name__ == "__main__":
    sys.exit(main())
