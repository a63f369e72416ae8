"""Published numbers as stored experiments: check their drift prefixes, render their tables.

Every table of the README and the docs comes from a folder ``experiments/NAME/`` holding
``README.md`` (the setting, the exact command, the environment, the expected numbers),
``run.sh`` (the command), ``runs/`` (each run's ``config.json``, ``summary.json`` and
``metrics.jsonl``, stored small) and ``prefix.json``: a cheap prefix of the command (one or
two rounds, less data) with the per-round values and final-state digest it gave on the
pinned CPU numeric path. Four verbs (``python benchmarks/results/experiments.py VERB``):

    check [NAME ...]   rerun the prefixes, compare bit for bit (exit 1 on drift)
    update NAME        store a prefix's new values on purpose
    measured NAME      say the full command was re-run at this code
    render [--check]   rewrite (or check) every rendered block

``update`` records the commit at which the values changed; until ``measured`` says the full
command was run again, the index marks that table "stale since" that commit, so no table
silently describes code that no longer exists.

Rendered blocks sit between ``<!-- experiment:KIND NAME [ARGS] -->`` and
``<!-- /experiment -->`` in Markdown files: ``table`` (``fedshift report`` of the stored runs,
ARGS passed to it), ``file`` (a file stored in the experiment's folder, as a script printed
it from runs whose checkpoints are not stored: ``<!-- experiment:file NAME runs/FILE -->``),
``prefix`` (the prefix's command and per-round values) and ``index`` (every experiment with its
status). ``render --check`` fails when a block and its stored summaries disagree.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "experiments"
#: the Markdown files that hold rendered blocks
RENDERED = ("README.md", "docs/*.md", "experiments/*.md", "experiments/*/README.md")
#: per-round keys that measure time, never compared
TIMING_KEYS = {"seconds", "wall_seconds", "cpu_seconds", "samples_per_second"}
BLOCK = re.compile(
    r"(<!-- experiment:(?P<kind>\w+)(?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- /experiment -->)",
    re.S,
)


class ExperimentError(Exception):
    """A user's mistake with this tool: one line, exit 2."""


def names() -> list[str]:
    return sorted(p.parent.name for p in EXPERIMENTS.glob("*/prefix.json"))


def load_prefix(name: str) -> dict:
    path = EXPERIMENTS / name / "prefix.json"
    if not path.is_file():
        raise ExperimentError(f"no experiment {name!r}; experiments: {', '.join(names())}")
    return json.loads(path.read_text())


def state_digest(checkpoint: Path) -> str:
    """sha256 of every server and client tensor of a run's final checkpoint."""
    state = torch.load(checkpoint, weights_only=True)
    digest = hashlib.sha256()

    def feed(obj) -> None:
        if isinstance(obj, torch.Tensor):
            digest.update(f"{obj.dtype}{tuple(obj.shape)}".encode())
            digest.update(obj.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
        elif isinstance(obj, dict):
            for key in sorted(obj, key=str):
                digest.update(str(key).encode())
                feed(obj[key])
        elif isinstance(obj, list | tuple):
            for item in obj:
                feed(item)

    feed({"server": state["server"], "clients": state["clients"]})
    return digest.hexdigest()


def numbers(row: dict) -> dict:
    """A metrics row without its timings."""
    return {k: v for k, v in row.items() if k not in TIMING_KEYS}


def run_prefix(prefix: dict, workdir: Path) -> dict:
    """Run a prefix's command into ``workdir``: its per-round values and state digest."""
    data = prefix.get("data")
    if data and not os.environ.get("FEDSHIFT_REAL_DATA"):
        raise ExperimentError(f"the prefix reads {data}: set FEDSHIFT_REAL_DATA")
    command = prefix["command"].replace(
        "$FEDSHIFT_REAL_DATA", os.environ.get("FEDSHIFT_REAL_DATA", "")
    )
    out = workdir / "run"
    argv = [*shlex.split(command), "--quiet", "--out", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{command} failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    config = json.loads((out / "config.json").read_text())
    return {
        "rounds": [numbers(row) for row in rows],
        "state_sha256": state_digest(out / "checkpoint.pt"),
        "numerics": config["run_info"].get("numerics"),
    }


def differences(stored: dict, now: dict) -> list[str]:
    """Where a rerun's prefix differs from the stored one (empty: bit for bit the same)."""
    found = []
    if len(stored["rounds"]) != len(now["rounds"]):
        found.append(f"{len(now['rounds'])} rounds, stored {len(stored['rounds'])}")
    for was, got in zip(stored["rounds"], now["rounds"], strict=False):
        for key, value in was.items():
            if got.get(key) != value:
                found.append(f"round {was.get('round')} {key}: {got.get(key)!r}, stored {value!r}")
    if stored["state_sha256"] != now["state_sha256"]:
        found.append("final model state differs (sha256)")
    return found


def head_commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    )
    return done.stdout.strip() or "unknown"


def status(prefix: dict) -> str:
    """``current``, or ``stale since COMMIT`` when the prefix changed after the measurement."""
    if prefix.get("measured_state_sha256") == prefix["state_sha256"]:
        return "current"
    return f"stale since {prefix.get('changed_at', 'unknown')}"


def check(selected: list[str]) -> int:
    failed = 0
    for name in selected or names():
        prefix = load_prefix(name)
        with tempfile.TemporaryDirectory() as tmp:
            found = differences(prefix, run_prefix(prefix, Path(tmp)))
        print(f"{name}: {'DRIFTED' if found else 'same'}")
        for line in found[:20]:
            print(f"  {line}")
        failed += bool(found)
    return 1 if failed else 0


def update(name: str) -> int:
    prefix = load_prefix(name)
    with tempfile.TemporaryDirectory() as tmp:
        now = run_prefix(prefix, Path(tmp))
    changed = differences(prefix, now) if prefix.get("rounds") else ["new"]
    if changed:
        prefix.update(now, changed_at=head_commit())
    write_prefix(name, prefix)
    print(f"{name}: {'updated' if changed else 'unchanged'}; {status(prefix)}")
    return 0


def measured(name: str) -> int:
    prefix = load_prefix(name)
    prefix["measured_state_sha256"] = prefix["state_sha256"]
    write_prefix(name, prefix)
    print(f"{name}: {status(prefix)}")
    return 0


def write_prefix(name: str, prefix: dict) -> None:
    (EXPERIMENTS / name / "prefix.json").write_text(json.dumps(prefix, indent=1) + "\n")


def render_table(name: str, args: str) -> str:
    runs = EXPERIMENTS / name / "runs"
    argv = [sys.executable, "-m", "fedshift.cli", "report", str(runs), *shlex.split(args)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise ExperimentError(f"fedshift report {runs}: {done.stderr.strip()[-500:]}")
    return done.stdout.strip() + "\n"


def render_file(name: str, relative: str) -> str:
    """A stored file of the experiment, verbatim (it may not leave the experiment's folder)."""
    folder = (EXPERIMENTS / name).resolve()
    path = (folder / relative).resolve()
    if folder not in path.parents or not path.is_file():
        raise ExperimentError(f"experiments/{name}/{relative} is not a file of the experiment")
    return path.read_text().strip() + "\n"


def render_prefix(name: str) -> str:
    prefix = load_prefix(name)
    keys = prefix.get("show", ["train_loss", "source_val_accuracy", "target_accuracy"])
    lines = [
        f"Drift prefix (`{status(prefix)}`; the default test tier reruns it and compares bit for "
        "bit on the pinned CPU path):",
        "",
        "```bash",
        prefix["command"] + " --out runs/prefix",
        "```",
        "",
        "| round | " + " | ".join(keys) + " |",
        "|---|" + "---|" * len(keys),
    ]
    for row in prefix["rounds"]:
        lines.append(f"| {row['round']} | " + " | ".join(repr(row.get(k)) for k in keys) + " |")
    lines += ["", f"Final model state sha256 `{prefix['state_sha256'][:16]}`."]
    return "\n".join(lines) + "\n"


def render_index() -> str:
    lines = ["| experiment | what | status |", "|---|---|---|"]
    for name in names():
        prefix = load_prefix(name)
        where = f"`experiments/{name}/`"
        lines.append(f"| {where} | {prefix.get('title', '')} | {status(prefix)} |")
    return "\n".join(lines) + "\n"


def render_text(text: str) -> str:
    def block(match: re.Match) -> str:
        kind, args = match["kind"], match["args"].strip()
        name, _, rest = args.partition(" ")
        if kind == "table":
            body = render_table(name, rest)
        elif kind == "file":
            body = render_file(name, rest)
        elif kind == "prefix":
            body = render_prefix(name)
        elif kind == "index":
            body = render_index()
        else:
            raise ExperimentError(f"unknown rendered block kind {kind!r}")
        return match.group(1) + body + match.group(5)

    return BLOCK.sub(block, text)


def rendered_files() -> list[Path]:
    return sorted({p for pattern in RENDERED for p in ROOT.glob(pattern)})


def render(check_only: bool) -> int:
    stale = []
    for path in rendered_files():
        text = path.read_text()
        if "<!-- experiment:" not in text:
            continue
        new = render_text(text)
        if new != text:
            stale.append(path.relative_to(ROOT))
            if not check_only:
                path.write_text(new)
    for path in stale:
        verb = "differs from its stored summaries" if check_only else "rendered"
        print(f"{path}: {verb}")
    return 1 if check_only and stale else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("check", help="rerun prefixes, compare").add_argument("names", nargs="*")
    verbs.add_parser("update", help="store a prefix's new values").add_argument("name")
    verbs.add_parser("measured", help="the full command was re-run").add_argument("name")
    verbs.add_parser("render", help="render blocks").add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.verb == "check":
            return check(args.names)
        if args.verb == "update":
            return update(args.name)
        if args.verb == "measured":
            return measured(args.name)
        return render(args.check)
    except ExperimentError as exc:
        print(f"experiments: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
