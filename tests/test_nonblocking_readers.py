"""Every reader of a user's or a run folder's file refuses what is not a regular file, in
one line and without blocking (#47 item 1): each reader is walked with a named pipe (which
blocked ``open()`` forever before), a folder, a device file (``/dev/zero``, read until a
size bound before) and a symbolic link loop, each under a time limit, so a regression fails
instead of hanging the suite."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedshift.config import read_toml
from fedshift.core.bounded import (
    check_regular_file,
    load_npy,
    read_bytes_bounded,
    read_json_bounded,
    read_toml_bounded,
)
from fedshift.core.errors import ConfigError, DatasetError, FedshiftError
from fedshift.core.outputs import is_fedshift_figure
from fedshift.core.runfiles import RunFiles, read_summary
from fedshift.core.state import load_checkpoint
from fedshift.data.formats.images import read_image
from fedshift.data.formats.mat import check_mat_file
from fedshift.data.image_cache import sampled_digest
from fedshift.data.lists import list_lines
from fedshift.engine.run.rundir import claim_run_dir
from fedshift.presets import load_preset
from fedshift.report.curves import read_run

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")

#: seconds a reader may take to refuse a bad file (each refuses in milliseconds)
LIMIT_S = 20
#: the kinds of file that are not regular files, and a word each refusal must hold
KINDS = {"fifo": "named pipe", "folder": "folder", "device": "device", "loop": "link loop"}


def make_bad(path: Path, kind: str) -> Path:
    """Put a ``kind`` at ``path``: a FIFO, a folder, a link to /dev/zero, a link loop."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:
        path.symlink_to(path.name)  # a link to itself: ELOOP
    return path


def within_limit(call: Callable[[], Any], fifo: Path | None) -> tuple[Any, BaseException | None]:
    """``call()``'s result or exception, run on a thread; fails the test when it is still
    running after :data:`LIMIT_S` (and then opens ``fifo`` for writing, so it ends)."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the test thread to judge
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(LIMIT_S)
    if thread.is_alive():
        if fifo is not None:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # lets the blocked open end
        pytest.fail(f"the reader blocked for more than {LIMIT_S} s")
    return outcome.get("value"), outcome.get("error")


def run_folder(root: Path) -> RunFiles:
    """A run folder with a config, two metric rows and a summary."""
    root.mkdir(parents=True, exist_ok=True)
    files = RunFiles(root)
    files.config.write_text(json.dumps({"algorithm": "fedavg", "target": "mnist", "seed": 0}))
    rows = [{"round": 1, "target_accuracy": 0.5}, {"round": 2, "target_accuracy": 0.6}]
    files.metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"algorithm": "fedavg", "target": "mnist", "seed": 0, "target_accuracy": 0.6}
    files.summary.write_text(json.dumps(summary))
    return files


def append_row(files: RunFiles) -> None:
    files.append_metrics({"round": 3})


def claim(root: Path) -> None:
    with claim_run_dir(root):
        pass


def key_file_reader(folder: Path) -> Callable[[], Any]:
    from fedshift.engine.flower.client_keys import load_client_keys

    (folder / "ck.toml").write_text('0 = "node.pub"\n')
    return lambda: load_client_keys(folder / "ck.toml", [0])


def client_keys_reader(folder: Path) -> Callable[[], Any]:
    from fedshift.engine.flower.client_keys import load_client_keys

    return lambda: load_client_keys(folder / "ck.toml", [0])


def text_lines(path: Path) -> Any:
    from fedshift.core.bounded import read_text_lines  # new with #47: the suite runs without

    return read_text_lines(path, ConfigError, "x")


def node_cache_hash(path: Path) -> Any:
    from fedshift.engine.flower.transport.node_cache import _sha256

    return _sha256(path)


#: (reader, the file it reads (relative to a fresh folder), how to call it on that folder);
#: each must raise a one-line error naming the kind, or return what means "not usable"
READERS: dict[str, tuple[str, Callable[[Path], Callable[[], Any]]]] = {
    "read_bytes_bounded": ("f", lambda d: lambda: read_bytes_bounded(d / "f", 9, ConfigError, "x")),
    "read_json_bounded": ("f.json", lambda d: lambda: read_json_bounded(d / "f.json", ConfigError)),
    "read_toml_bounded": ("f.toml", lambda d: lambda: read_toml_bounded(d / "f.toml", ConfigError)),
    "read_text_lines": ("f.txt", lambda d: lambda: text_lines(d / "f.txt")),
    "check_regular_file": ("f", lambda d: lambda: check_regular_file(d / "f", "x", ConfigError)),
    "load_npy": ("a.npy", lambda d: lambda: load_npy(d / "a.npy", DatasetError)),
    "load_npy mapped": ("a.npy", lambda d: lambda: load_npy(d / "a.npy", DatasetError, "r")),
    "--config": ("c.toml", lambda d: lambda: read_toml(d / "c.toml")),
    "--preset": ("p.toml", lambda d: lambda: load_preset(d / "p.toml")),
    "client-keys file": ("ck.toml", client_keys_reader),
    "client-keys key file": ("node.pub", key_file_reader),
    "metrics.jsonl lines": ("run/metrics.jsonl", lambda d: run_folder(d / "run").metric_lines),
    "metrics.jsonl history": ("run/metrics.jsonl", lambda d: run_folder(d / "run").history),
    "metrics.jsonl append": (
        "run/metrics.jsonl",
        lambda d: functools.partial(append_row, run_folder(d / "run")),
    ),
    "plot curves read_run": (
        "run/metrics.jsonl",
        lambda d: functools.partial(read_run, run_folder(d / "run").root),
    ),
    "checkpoint.pt": (
        "run/checkpoint.pt",
        lambda d: lambda: load_checkpoint(d / "run/checkpoint.pt", fallback=False),
    ),
    "run .lock": ("run/.lock", lambda d: lambda: claim(d / "run")),
    "split list": ("train.txt", lambda d: lambda: list(list_lines(d / "train.txt"))),
    "image": ("a.png", lambda d: lambda: read_image(d / "a.png", 8)),
    ".mat file": ("a.mat", lambda d: lambda: check_mat_file(d / "a.mat")),
    "image cache digest": ("c.npy", lambda d: lambda: sampled_digest(d / "c.npy")),
    "node cache hash": ("c.npy", lambda d: lambda: node_cache_hash(d / "c.npy")),
}

#: readers that answer "not usable" instead of raising: a summary is skipped with a warning,
#: a file that is not a figure is not fedshift's to replace
QUIET_READERS: dict[str, tuple[str, Callable[[Path], Callable[[], Any]], Any]] = {
    "summary.json": ("run/summary.json", lambda d: lambda: read_summary(d / "run"), None),
    "figure check": ("f.png", lambda d: lambda: is_fedshift_figure(d / "f.png"), False),
}


def refused(error: BaseException | None, kind: str) -> bool:
    """Whether ``error`` is a one-line refusal that says what the file is."""
    from fedshift.engine.flower.transport.node_cache import CacheInvalid

    if not isinstance(error, FedshiftError | CacheInvalid):
        return False
    text = str(error)
    return "\n" not in text and (KINDS[kind] in text or "does not exist" in text)


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("reader", sorted(READERS))
def test_each_reader_refuses_what_is_not_a_regular_file_at_once(tmp_path, reader, kind):
    relative, make_call = READERS[reader]
    call = make_call(tmp_path)
    target = tmp_path / relative
    if target.exists() or target.is_symlink():
        if target.is_dir():
            target.rmdir()
        else:
            target.unlink()
    make_bad(target, kind)
    value, error = within_limit(call, target if kind == "fifo" else None)
    assert refused(error, kind), f"{reader} on a {kind}: {error!r} (returned {value!r})"


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("reader", sorted(QUIET_READERS))
def test_readers_that_skip_a_bad_file_skip_it_at_once(tmp_path, reader, kind):
    relative, make_call, unusable = QUIET_READERS[reader]
    call = make_call(tmp_path)
    target = tmp_path / relative
    if relative.startswith("run/"):
        run_folder(tmp_path / "run")
        target.unlink()
    make_bad(target, kind)
    value, error = within_limit(call, target if kind == "fifo" else None)
    assert error is None and value == unusable, (error, value)


def fedshift_cli(*argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    return subprocess.run(
        [sys.executable, "-m", "fedshift.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,  # the CLI's start (torch's import) included; a blocked open never ends
        env=env,
    )


def test_report_and_plot_curves_do_not_hang_on_named_pipes_in_a_runs_folder(tmp_path):
    """The audit's cases: ``summary.json`` a FIFO hangs ``report DIR`` and ``report`` on its
    parent; ``metrics.jsonl`` a FIFO hangs ``plot curves``."""
    good = run_folder(tmp_path / "runs" / "good")
    bad = run_folder(tmp_path / "runs" / "bad")
    bad.summary.unlink()
    os.mkfifo(bad.summary)
    for target in (bad.root, bad.root.parent):
        done = fedshift_cli("report", str(target))
        assert "Traceback" not in done.stderr, done.stderr
        assert "is not a regular file (a named pipe)" in done.stderr, done.stderr
    assert "| fedavg" in done.stdout, done.stdout  # the good run is still reported
    os.unlink(good.metrics)
    os.mkfifo(good.metrics)
    done = fedshift_cli("plot", "curves", str(good.root), "--out", str(tmp_path / "c.png"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "named pipe" in done.stderr, done.stderr
