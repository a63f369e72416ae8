"""Checkpoints and run files: corruption is detected, the previous checkpoint stands in,
writes are atomic and leave no temp file, ``--resume`` needs no repeated flags and
``--resume --rounds N`` extends a finished run to exactly the numbers of a straight N-round
run."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import read_history

from fedshift.algorithms import REGISTRY
from fedshift.algorithms.fedavg import FedAvg
from fedshift.cli import main
from fedshift.config import resolve
from fedshift.core.errors import CheckpointError, StorageError
from fedshift.core.state import (
    CHECKPOINT_FORMAT,
    load_checkpoint,
    previous_path,
    save_checkpoint,
    write_text_atomically,
)
from fedshift.engine.assembly import prepare
from fedshift.engine.run.runner import Runner
from fedshift.report.aggregate import find_summaries
from fedshift.sweeps import sweep

SMALL = ["--set", "client_data_fraction=0.05", "--set", "device=cpu", "--set", "threads=1"]


def flip_two_bytes(path, at: float) -> None:
    """Flip two neighbouring bytes at relative position ``at`` of the file."""
    data = bytearray(path.read_bytes())
    i = min(int(len(data) * at), len(data) - 2)
    data[i] ^= 0x01
    data[i + 1] ^= 0x80
    path.write_bytes(bytes(data))


def payload(seed: int = 0) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {
        "format": CHECKPOINT_FORMAT,
        "round": seed,
        "server": {"model": {"w": torch.randn(64, 64, generator=gen)}, "extra": {}},
    }


@pytest.mark.parametrize("at", [0.0, 0.1, 0.3, 0.5, 0.9, 1.0])
def test_two_flipped_bytes_anywhere_are_detected(tmp_path, at):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(payload(), path)
    assert torch.equal(
        load_checkpoint(path)["server"]["model"]["w"], payload()["server"]["model"]["w"]
    )
    flip_two_bytes(path, at)
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(path, fallback=False)


def test_previous_checkpoint_is_kept_and_stands_in_for_a_corrupt_one(tmp_path, caplog):
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(payload(1), path)
    assert not previous_path(path).exists()
    save_checkpoint(payload(2), path)
    assert previous_path(path).name == "checkpoint.prev.pt"
    assert load_checkpoint(previous_path(path))["round"] == 1
    flip_two_bytes(path, 0.5)
    with caplog.at_level(logging.WARNING):
        assert load_checkpoint(path)["round"] == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "using the previous checkpoint checkpoint.prev.pt" in warnings[0]
    # the next save replaces the corrupt latest and keeps the good previous one
    save_checkpoint(payload(3), path)
    assert load_checkpoint(previous_path(path))["round"] == 1
    assert load_checkpoint(path, fallback=False)["round"] == 3
    # both unusable: a clear error naming both
    flip_two_bytes(path, 0.5)
    flip_two_bytes(previous_path(path), 0.5)
    with pytest.raises(CheckpointError, match="previous checkpoint .* is unusable too"):
        load_checkpoint(path)


def test_plain_torch_load_still_reads_a_checkpoint(tmp_path):
    """The hash trails the archive, so a checkpoint stays a file torch.load reads directly."""
    save_checkpoint(payload(5), tmp_path / "checkpoint.pt")
    plain = torch.load(tmp_path / "checkpoint.pt", map_location="cpu", weights_only=True)
    assert plain["round"] == 5 and torch.equal(
        plain["server"]["model"]["w"], payload(5)["server"]["model"]["w"]
    )


def test_an_older_unhashed_checkpoint_still_loads(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save(payload(4), path)
    assert load_checkpoint(path)["round"] == 4


def full_disk(monkeypatch) -> None:
    def write(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", write)


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    write_text_atomically(path, '{"old": 1}\n')
    save_checkpoint(payload(1), tmp_path / "checkpoint.pt")
    with monkeypatch.context() as patch:
        full_disk(patch)
        with pytest.raises(StorageError, match="cannot write .*summary.json: No space left"):
            write_text_atomically(path, '{"new": 2}\n')
        with pytest.raises(StorageError, match="No space left on device"):
            save_checkpoint(payload(2), tmp_path / "checkpoint.pt")
    assert path.read_text() == '{"old": 1}\n'
    assert load_checkpoint(tmp_path / "checkpoint.pt", fallback=False)["round"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "summary.json"]


# -- runs ----------------------------------------------------------------------------------


def make_cfg(algorithm: str, rounds: int):
    protocol = (REGISTRY[algorithm].protocols or ("lodo",))[0]
    flags = {"algorithm": algorithm, "target": "optdigits", "protocol": protocol}
    return resolve(None, flags, [f"rounds={rounds}", "batch_size=32", "device=cpu"])


def run(tmp_path, name, algorithm, dataset, rounds, **kw):
    runner = Runner(
        prepare(make_cfg(algorithm, rounds), dataset=dataset), tmp_path / name, progress=False
    )
    return runner.run(**kw)


def without_timing(rows):
    return [{k: v for k, v in row.items() if k not in ("seconds", "cpu_seconds")} for row in rows]


def assert_same_state(a, b):
    for name, tensor in a["server"]["model"].items():
        assert torch.equal(b["server"]["model"][name], tensor), name
    for cid, state in a["clients"].items():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(b["clients"][cid][key], value), (cid, key)


ACCURACIES = ("target_accuracy", "target_accuracy_last", "source_val_accuracy")


def test_resume_from_the_previous_checkpoint_is_bit_identical(tmp_path, tiny16_digits, caplog):
    straight = run(tmp_path, "a", "fedavg", tiny16_digits, 3)
    assert run(tmp_path, "b", "fedavg", tiny16_digits, 3, stop_after=2) == {}
    flip_two_bytes(tmp_path / "b" / "checkpoint.pt", 0.6)
    (tmp_path / "b" / "checkpoint.pt.k1ll3d00.tmp").write_bytes(b"half a checkpoint")
    with caplog.at_level(logging.WARNING):
        resumed = run(tmp_path, "b", "fedavg", tiny16_digits, 3, resume=True)
    assert any("(round 1) instead" in r.getMessage() for r in caplog.records)
    for key in ACCURACIES:
        assert resumed[key] == straight[key], key
    assert without_timing(read_history(tmp_path / "b")) == without_timing(
        read_history(tmp_path / "a")
    )
    assert_same_state(
        load_checkpoint(tmp_path / "a" / "checkpoint.pt"),
        load_checkpoint(tmp_path / "b" / "checkpoint.pt"),
    )


def test_resume_on_other_client_data_is_refused_and_writes_nothing(tmp_path, tiny16_digits):
    """A run whose clients held other data (a changed copy, or a fedshift that splits it
    otherwise, e.g. a held-out test part where the whole domain was tested) is not
    continued on today's data: one line naming the first client that differs."""
    assert run(tmp_path, "b", "fedavg", tiny16_digits, 3, stop_after=2) == {}
    config_file = tmp_path / "b" / "config.json"
    config = json.loads(config_file.read_text())
    config["run_info"]["clients"][1]["test"] += 7  # the run's client 1 was tested on more
    config_file.write_text(json.dumps(config))

    def files() -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in (tmp_path / "b").iterdir() if p.is_file()}

    kept = files()
    with pytest.raises(CheckpointError, match=r"clients' data differ from the run's \(client 1"):
        run(tmp_path, "b", "fedavg", tiny16_digits, 3, resume=True)
    assert files() == kept
    del config["run_info"]["clients"]  # a config.json without the list is not checked
    config_file.write_text(json.dumps(config))
    assert run(tmp_path, "b", "fedavg", tiny16_digits, 3, resume=True)["rounds"] == 3


@pytest.mark.parametrize("algorithm", ["fedavg", "ditto", "fedproto", "moon"])
def test_extending_a_finished_run_equals_a_straight_longer_run(tmp_path, tiny16_digits, algorithm):
    straight = run(tmp_path, "straight", algorithm, tiny16_digits, 3)
    first = run(tmp_path, "extended", algorithm, tiny16_digits, 2)
    assert first["rounds"] == 2
    extended = run(tmp_path, "extended", algorithm, tiny16_digits, 3, resume=True)
    assert extended["rounds"] == 3
    for key in ACCURACIES:
        assert extended[key] == straight[key], key
    history = without_timing(read_history(tmp_path / "extended"))
    assert history == without_timing(read_history(tmp_path / "straight"))
    assert_same_state(
        load_checkpoint(tmp_path / "straight" / "checkpoint.pt"),
        load_checkpoint(tmp_path / "extended" / "checkpoint.pt"),
    )


def test_cli_resume_needs_no_flags_and_extends_with_rounds(in_tmp, capsys, monkeypatch):
    argv = ["run", "-t", "optdigits", "--rounds", "2", "--quiet", *SMALL, "--set", "lr=0.02"]
    assert main([*argv, "--out", "straight"]) == 0
    original = FedAvg.round

    def interrupted(self, state, fed):
        if fed.round == 2:
            raise KeyboardInterrupt
        return original(self, state, fed)

    with monkeypatch.context() as patch:
        patch.setattr(FedAvg, "round", interrupted)
        assert main([*argv, "--out", "r"]) == 130
    assert main(["run", "--out", "r", "--resume", "--quiet"]) == 0  # no flags repeated
    summary = json.loads((in_tmp / "r" / "summary.json").read_text())
    reference = json.loads((in_tmp / "straight" / "summary.json").read_text())
    for key in ACCURACIES:
        assert summary[key] == reference[key], key
    assert json.loads((in_tmp / "r" / "config.json").read_text())["lr"] == 0.02
    # extend the finished run to 3 rounds: the first 2 rounds are untouched
    rows = without_timing(read_history(in_tmp / "r"))
    assert main(["run", "--out", "r", "--resume", "--rounds", "3", "--quiet"]) == 0
    assert without_timing(read_history(in_tmp / "r"))[:2] == rows
    assert json.loads((in_tmp / "r" / "summary.json").read_text())["rounds"] == 3
    assert json.loads((in_tmp / "r" / "config.json").read_text())["rounds"] == 3
    capsys.readouterr()
    assert main(["run", "--out", "r", "--resume", "--rounds", "2", "--quiet"]) == 2
    assert "cannot shorten rounds" in capsys.readouterr().err


def test_report_and_sweep_skip_a_half_written_summary(in_tmp, capsys, caplog):
    plan = dict(algorithms=["fedavg"], targets=["optdigits"], seeds=[0], out="sw")
    options = dict(flags={"rounds": 1}, sets=SMALL[1::2], progress=False)
    [done] = sweep(**plan, **options)
    path = in_tmp / "sw" / "fedavg-optdigits-s0" / "summary.json"
    path.write_text(path.read_text()[:40])  # as a crash of an older writer would leave it
    with caplog.at_level(logging.WARNING):
        assert find_summaries(["sw"]) == []
    assert any("half-written" in r.getMessage() for r in caplog.records)
    capsys.readouterr()
    assert main(["report", "sw"]) == 2
    assert "no summary.json under sw" in capsys.readouterr().err
    # the sweep finishes it again from its checkpoint (one warning): the same numbers
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        [again] = sweep(**plan, **options)
    assert sum("half-written" in r.getMessage() for r in caplog.records) == 1
    assert again == done
    assert json.loads(path.read_text()) == done


@pytest.mark.slow
def test_sigkill_then_resume_is_bit_identical(in_tmp, capsys):
    """A real ``kill -9`` of a CLI run mid-way; ``--resume`` ends exactly like a straight run
    (slow: a second Python process imports torch and loads the data, ~30 s on 2 cores)."""
    argv = ["run", "-t", "optdigits", "--rounds", "4", "--quiet", *SMALL]
    assert main([*argv, "--out", "straight"]) == 0
    code = f"from fedshift.cli import main; main({[*argv, '--out', 'killed']!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=in_tmp, env=dict(os.environ))
    checkpoint = in_tmp / "killed" / "checkpoint.pt"
    deadline = time.monotonic() + 120
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert checkpoint.exists() and not (in_tmp / "killed" / "summary.json").exists()
    assert main(["run", "--out", "killed", "--resume", "--quiet"]) == 0
    killed = json.loads((in_tmp / "killed" / "summary.json").read_text())
    straight = json.loads((in_tmp / "straight" / "summary.json").read_text())
    for key in ACCURACIES:
        assert killed[key] == straight[key], key
    assert without_timing(read_history(in_tmp / "killed")) == without_timing(
        read_history(in_tmp / "straight")
    )
    assert not [p for p in (in_tmp / "killed").iterdir() if p.name.endswith(".tmp")]
