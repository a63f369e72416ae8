"""The reliability battery: hostile inputs against the command line and the readers, each
case *held* (one line, the right exit code, no traceback, within its time limit, nothing
imported or overwritten) or *failed*, counted per battery.

    python benchmarks/tools/reliability_battery.py            # about 2 minutes on 2 CPU cores
    python benchmarks/tools/reliability_battery.py --keep DIR # keep the work folder

Batteries: the four items of issue 47 (no reader blocks on a pipe, client ids bound once,
``--resume`` on changed data, the smaller items) and a few fixes of earlier issues listed in
docs/reliability.md (a device as preset, deep TOML and JSON, corrupt checkpoints, a saved
config naming code, a figure over a checkpoint). Commands run in this process through
``fedshift.cli.main`` on a thread with a time limit, so a reader that blocks is a failed
case, not a hung battery. Exit status: 0 when every case held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from fedshift.cli import main
from fedshift.core.bounded import load_npy, read_json_bounded
from fedshift.core.errors import FedshiftError
from fedshift.engine.flower.client_keys import load_client_keys

#: seconds a case may take (a refusal takes milliseconds; a short run a few seconds)
LIMIT_S = 60
#: the flags that keep each run small and on one CPU thread
SMALL = ["--quiet", "--set", "device=cpu", "--set", "threads=1"]
SMALL += ["--set", "client_data_fraction=0.05"]
#: the kinds of file that are not regular files
KINDS = ("fifo", "folder", "device", "loop")


@dataclass
class Outcome:
    """What a case did: its exit code (or result), stderr, exception, and whether it ended."""

    code: Any = None
    err: str = ""
    out: str = ""
    error: BaseException | None = None
    ended: bool = True


@dataclass
class Battery:
    name: str
    held: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def record(self, case: str, ok: bool, detail: str = "") -> None:
        (self.held if ok else self.failed).append(case if ok else f"{case}: {detail}")


def within_limit(call: Callable[[], Any], fifo: Path | None = None) -> Outcome:
    """``call()`` on a daemon thread, its stdout and stderr captured; a call still running
    after :data:`LIMIT_S` is an outcome that did not end (``fifo`` is then opened for
    writing, which lets a blocked open return)."""
    outcome = Outcome(ended=False)
    out, err = io.StringIO(), io.StringIO()

    def target() -> None:
        logging.getLogger().handlers.clear()  # the CLI's basicConfig binds the stderr of now
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                outcome.code = call()
        except BaseException as exc:  # the battery judges it
            outcome.error = exc
        outcome.ended = True

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(LIMIT_S)
    if thread.is_alive() and fifo is not None:
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(5)
    sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    outcome.out, outcome.err = out.getvalue(), err.getvalue()
    return outcome


def cli(*argv: str, fifo: Path | None = None) -> Outcome:
    return within_limit(lambda: main(list(argv)), fifo)


def one_line(outcome: Outcome, code: int = 2, expected: str = "") -> tuple[bool, str]:
    """Whether the command ended with ``code`` and said ``expected`` in one stderr line."""
    lines = outcome.err.strip().splitlines()
    if not outcome.ended:
        return False, f"still running after {LIMIT_S} s"
    if outcome.error is not None:
        return False, f"raised {outcome.error!r}"
    if "Traceback" in outcome.err:
        return False, "traceback: " + outcome.err[-300:]
    if outcome.code != code:
        return False, f"exit {outcome.code}, expected {code}: {outcome.err.strip()[-300:]}"
    if code != 0 and len(lines) != 1:
        return False, f"{len(lines)} stderr lines: {lines[:3]}"
    if expected and expected not in outcome.err:
        return False, f"{expected!r} not in {outcome.err.strip()[-300:]!r}"
    return True, ""


def refused(outcome: Outcome, expected: str) -> tuple[bool, str]:
    """Whether a library call raised a one-line fedshift error saying ``expected``."""
    if not outcome.ended:
        return False, f"still running after {LIMIT_S} s"
    error = outcome.error
    if error is None:
        return False, f"returned {outcome.code!r}"
    if not isinstance(error, FedshiftError) or "\n" in str(error):
        return False, f"raised {error!r}"
    if expected not in str(error):
        return False, f"{expected!r} not in {str(error)!r}"
    return True, ""


def make_bad(path: Path, kind: str) -> Path:
    """Replace ``path`` by a FIFO, a folder, a link to /dev/zero or a link loop."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.symlink_to(path.name)
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def start_run(work: Path, name: str, *extra: str) -> Path:
    """A finished one-round run on digits-dg (the template the resume cases copy)."""
    out = work / name
    done = cli("run", "--out", str(out), "--rounds", "1", *SMALL, *extra)
    ok, detail = one_line(done, 0)
    if not ok:
        raise SystemExit(f"the template run failed: {detail}")
    return out


def copy_run(template: Path, work: Path, name: str) -> Path:
    target = work / name
    shutil.copytree(template, target, symlinks=True)
    (target / ".lock").unlink(missing_ok=True)
    return target


# -- issue 47 item 1: no reader blocks on a pipe -------------------------------------------

#: run files a resume may recover instead of refusing: ``metrics.jsonl`` is rewritten from
#: the checkpoint's history (a regular file replaces the pipe); an unreadable ``config.json``
#: is read from the checkpoint, with one warning naming it
REWRITTEN: dict[str, Callable[[Path, Outcome], bool]] = {
    "metrics.jsonl": lambda path, done: path.is_file() and not path.is_symlink(),
    "config.json": lambda path, done: (
        "config.json" in done.err and "from the checkpoint" in done.err
    ),
}


def readers_battery(work: Path, template: Path) -> Battery:
    battery = Battery("47.1 readers refuse pipes, folders, devices, link loops")
    for kind in KINDS:
        base = work / f"readers-{kind}"
        base.mkdir()
        fifo = kind == "fifo"
        # a runs folder: one good run, one whose summary.json is bad
        runs = base / "runs"
        good, bad = copy_run(template, runs, "good"), copy_run(template, runs, "bad")
        target = make_bad(bad / "summary.json", kind)
        done = cli("report", str(bad), fifo=target if fifo else None)
        lines = done.err.strip().splitlines()
        ok = done.ended and done.code == 2 and "Traceback" not in done.err and len(lines) <= 2
        ok = ok and lines[-1].startswith("fedshift: error:")  # a warning naming it, if any
        battery.record(f"report a run whose summary.json is a {kind}", ok, done.err[-300:])
        done = cli("report", str(runs), fifo=target if fifo else None)
        ok, detail = one_line(done, 0)
        battery.record(
            f"report its parent: the good run still listed ({kind})",
            ok and "| fedavg" in done.out,
            detail or done.out[-300:],
        )
        target = make_bad(good / "metrics.jsonl", kind)
        done = cli(
            "plot", "curves", str(good), "--out", str(base / "c.png"), fifo=target if fifo else None
        )
        battery.record(f"plot curves with metrics.jsonl a {kind}", *one_line(done))
        for flag, name in (("--config", "c.toml"), ("--preset", "p.toml")):
            target = make_bad(base / name, kind)
            done = cli("run", flag, str(target), *SMALL, fifo=target if fifo else None)
            battery.record(f"run {flag} a {kind}", *one_line(done))
        for file in ("checkpoint.pt", "config.json", "metrics.jsonl", ".lock"):
            run_dir = copy_run(template, base, f"resume-{file}")
            if file == "checkpoint.pt":
                (run_dir / "checkpoint.prev.pt").unlink(missing_ok=True)
            target = make_bad(run_dir / file, kind)
            done = cli(
                "run", "--out", str(run_dir), "--resume", "--rounds", "2", *SMALL,
                fifo=target if fifo else None,
            )  # fmt: skip
            case = f"run --resume with {file} a {kind}"
            if file in REWRITTEN and done.code == 0:  # replaced by a regular file, or read
                ok = done.ended and "Traceback" not in done.err  # from the checkpoint instead
                battery.record(case, ok and REWRITTEN[file](run_dir / file, done), done.err[-300:])
            else:
                battery.record(case, *one_line(done))
        keys = base / "keys"
        keys.mkdir()
        (keys / "ck.toml").write_text('0 = "node.pub"\n')
        target = make_bad(keys / "node.pub", kind)
        done = within_limit(
            lambda k=keys: load_client_keys(k / "ck.toml", [0]), target if fifo else None
        )
        battery.record(f"client-keys key file a {kind}", *refused(done, "public key file"))
        target = make_bad(keys / "ck.toml", kind)
        done = within_limit(
            lambda k=keys: load_client_keys(k / "ck.toml", [0]), target if fifo else None
        )
        battery.record(f"client-keys file a {kind}", *refused(done, "client-keys file"))
        target = make_bad(base / "cache.npy", kind)
        done = within_limit(
            lambda t=target: load_npy(t, FedshiftError, "r"), target if fifo else None
        )
        battery.record(f"a cache .npy a {kind}", *refused(done, ".npy file"))
    return battery


# -- issue 47 item 2: each client bound once -----------------------------------------------


def client_keys_battery(work: Path) -> Battery:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    battery = Battery("47.2 client-keys: canonical ids, node ids a SuperLink issues")
    folder = work / "client-keys"
    folder.mkdir()
    for name in ("a.pub", "b.pub"):
        public = ec.generate_private_key(ec.SECP384R1()).public_key()
        ssh = public.public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
        )
        (folder / name).write_bytes(ssh)
    good = '0 = "a.pub"\n1 = 5\n2 = 6\n'
    cases = {
        "00 after 0": (good + '00 = "b.pub"\n', "line 4: '00' is not a client id"),
        '"+0"': (good + '"+0" = "b.pub"\n', "line 4: '+0' is not a client id"),
        '" 1"': (good + '" 1" = 7\n', "line 4: ' 1' is not a client id"),
        "0_0": (good + '0_0 = "b.pub"\n', "line 4: '0_0' is not a client id"),
        "Arabic-Indic 2": (
            '0 = "a.pub"\n1 = 5\n"\u0662" = 6\n',
            "line 3: '\u0662' is not a client id",
        ),
        "node id 2**70": (
            f'0 = "a.pub"\n1 = {2**70}\n2 = 6\n',
            "line 2: client 1 = 1180591620717411303424",
        ),
        "node id 2**64": (f'0 = "a.pub"\n1 = {2**64}\n2 = 6\n', "a node id is from 2 to 2**64 - 1"),
        "node id 0": ('0 = "a.pub"\n1 = 0\n2 = 6\n', "line 2: client 1 = 0"),
        "node id -5": ('0 = "a.pub"\n1 = -5\n2 = 6\n', "line 2: client 1 = -5"),
    }
    for case, (text, expected) in cases.items():
        (folder / "ck.toml").write_text(text, encoding="utf-8")
        done = within_limit(lambda: load_client_keys(folder / "ck.toml", [0, 1, 2]))
        battery.record(case, *refused(done, expected))
    (folder / "ck.toml").write_text('0 = "a.pub"\n1 = 18446744073709551615\n2 = 2\n')
    done = within_limit(lambda: load_client_keys(folder / "ck.toml", [0, 1, 2]))
    ok = done.error is None and done.code.node_ids == {1: 2**64 - 1, 2: 2}
    battery.record("a good file (node ids 2**64 - 1 and 2) binds", ok, repr(done.error))
    return battery


# -- issue 47 item 4: --resume notices changed data ----------------------------------------


def write_png(path: Path, colour: tuple[int, int, int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), colour).save(path)


def resume_data_battery(work: Path, template: Path) -> Battery:
    battery = Battery("47.4 --resume on changed data")
    tree = work / "tree"
    rng = np.random.default_rng(0)
    for domain in ("art", "photo", "sketch"):
        for cls in ("cat", "dog"):
            for i in range(6):
                write_png(tree / domain / cls / f"{i}.png", tuple(rng.integers(0, 255, 3).tolist()))
    out = work / "folder-run"
    flags = ["--set", "device=cpu", "--set", "threads=1", "--quiet"]
    start = ["run", "--out", str(out), "--dataset", f"folder:{tree}", "--target", "sketch"]
    start += ["--rounds", "1", "--set", "image_size=8", "--set", "batch_size=4", *flags]
    ok, detail = one_line(cli(*start), 0)
    battery.record("a run on an image folder starts", ok, detail)
    resume = ["run", "--out", str(out), "--resume", "--rounds", "2", *flags]
    image = tree / "photo" / "dog" / "3.png"
    before = image.read_bytes()
    write_png(image, (1, 2, 3))
    same_size = len(image.read_bytes()) == len(before)
    ok, detail = one_line(cli(*resume), 2, "the data of domain 'photo' changed")
    battery.record("one image replaced by one of the same size", ok and same_size, detail)
    image.write_bytes(before)
    write_png(tree / "art" / "cat" / "6.png", (9, 9, 9))
    ok, detail = one_line(cli(*resume), 2, "the data of domain 'art' changed")
    battery.record("one image added", ok, detail)
    done = cli(*start, "--force-data")
    battery.record("--force-data without --resume", *one_line(done, 2, "is for --resume"))
    ok, detail = one_line(cli(*resume, "--force-data"), 0)
    battery.record("--force-data continues on the new data", ok, detail)
    again = ["run", "--out", str(out), "--resume", "--rounds", "3", *flags]
    ok, detail = one_line(cli(*again), 0)
    battery.record("the next --resume compares to the recorded new data", ok, detail)
    run_dir = copy_run(template, work, "digits-resume")
    ok, detail = one_line(cli("run", "--out", str(run_dir), "--resume", "--rounds", "2", *SMALL), 0)
    battery.record("digits-dg resumes on unchanged data", ok, detail)
    info = read_json_bounded(run_dir / "config.json", FedshiftError)["run_info"]
    digests = info.get("data_digests", {})
    battery.record("config.json records 4 domain digests", len(digests) == 4, repr(digests))
    return battery


# -- issue 47, smaller items ----------------------------------------------------------------


def smaller_battery(work: Path) -> Battery:
    battery = Battery("47 smaller items")
    done = cli("run", "--set", "catalog_split=full", "--rounds", "1", "--dry-run", *SMALL)
    battery.record("catalog_split=full on digits-dg", *one_line(done, 2, "not to 'digits-dg'"))
    done = cli("show", "run")
    row = next((r for r in done.out.splitlines() if "channels_last " in r), "")
    ok = "on the CPU for the EfficientNet-Lite backbones" in row
    battery.record("show run: channels_last=auto names the CPU case", ok, row)
    return battery


# -- earlier fixes (docs/reliability.md) -----------------------------------------------------


def earlier_battery(work: Path, template: Path) -> Battery:
    battery = Battery("earlier fixes (docs/reliability.md)")
    base = work / "earlier"
    base.mkdir()
    done = cli("run", "--preset", "/dev/zero", *SMALL)
    battery.record(
        "--preset /dev/zero (#34)", *one_line(done, 2, "/dev/zero is not a regular file")
    )
    done = cli("run", "--config", str(base), *SMALL)
    battery.record("--config a folder (#34)", *one_line(done, 2, "is a folder"))
    deep = base / "deep.toml"
    deep.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    battery.record(
        "--config 100,000-deep TOML", *one_line(cli("run", "--config", str(deep), *SMALL))
    )
    runs = base / "runs"
    copy_run(template, runs, "good")
    bad = copy_run(template, runs, "deep")
    (bad / "summary.json").write_text("[" * 100_000 + "]" * 100_000)
    done = cli("report", str(runs))
    ok = done.ended and done.code == 0 and "Traceback" not in done.err and "| fedavg" in done.out
    battery.record("report beside a 100,000-deep summary.json", ok, done.err[-300:])
    corrupt = copy_run(template, base, "corrupt")
    for name in ("checkpoint.pt", "checkpoint.prev.pt"):
        path = corrupt / name
        if path.exists():
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))
    done = cli("run", "--out", str(corrupt), "--resume", "--rounds", "2", *SMALL)
    battery.record("--resume on a checkpoint with a flipped byte", *one_line(done, 2, "corrupt"))
    evil = copy_run(template, base, "evil")
    config = json.loads((evil / "config.json").read_text())
    config["algorithm"] = "evilmod:Evil"
    (evil / "config.json").write_text(json.dumps(config))
    marker = base / "imported"
    (base / "evilmod.py").write_text(f"open({str(marker)!r}, 'w').close()\nEvil = None\n")
    sys.path.insert(0, str(base))
    try:
        done = cli("run", "--out", str(evil), "--resume", *SMALL)
    finally:
        sys.path.remove(str(base))
    ok, detail = one_line(done, 2, "--allow-imports")
    battery.record("a config.json naming code is not imported", ok and not marker.exists(), detail)
    checkpoint = template / "checkpoint.pt"
    digest = sha256(checkpoint)
    done = cli("plot", "curves", str(template), "--out", str(checkpoint))
    ok, detail = one_line(done, 2)
    battery.record("no figure over a checkpoint", ok and sha256(checkpoint) == digest, detail)
    return battery


def main_(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="work in this folder and keep it (default: a temp one)")
    args = parser.parse_args(argv)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="fedshift-battery-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    try:
        template = start_run(work, "template")
        batteries = [
            readers_battery(work, template),
            client_keys_battery(work),
            resume_data_battery(work, template),
            smaller_battery(work),
            earlier_battery(work, template),
        ]
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    for battery in batteries:
        print(f"{battery.name}: {len(battery.held)} held, {len(battery.failed)} failed")
        for case in battery.failed:
            print(f"  FAILED {case}")
    held = sum(len(b.held) for b in batteries)
    failed = sum(len(b.failed) for b in batteries)
    print(f"total: {held} held, {failed} failed ({time.perf_counter() - started:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.stdout.flush()
    code = main_()
    sys.stdout.flush()
    os._exit(code)  # a case that blocked leaves a thread behind: do not wait for it
