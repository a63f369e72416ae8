"""Memory under load (issue 23): the checkpoint is streamed to its file and hashed on the
way, never serialized whole in memory; a round keeps start-of-round client states only for
the clients it calls, and none when the latest checkpoint already holds them."""

from __future__ import annotations

import gc
import hashlib
import io
import os
import tracemalloc
import weakref

import pytest
import torch
from helpers import cfg

from fedshift.core import state as state_module
from fedshift.core.errors import RoundFailed
from fedshift.core.state import MAGIC, TRAILER_SIZE, load_checkpoint, save_checkpoint
from fedshift.engine.assembly import prepare
from fedshift.engine.run.runner import Runner
from fedshift.engine.simulation import dispatch


def many_tensors() -> dict:
    """A checkpoint-like object of 8 MiB in 32 tensors of 256 KiB."""
    gen = torch.Generator().manual_seed(0)
    clients = {str(i): {"w": torch.randn(256, 256, generator=gen)} for i in range(32)}
    return {"format": "fedshift-checkpoint-v1", "round": 1, "clients": clients}


def test_the_checkpoint_is_streamed_to_its_file_and_hashed_on_the_way(tmp_path, monkeypatch):
    obj = many_tensors()
    memory = io.BytesIO()
    torch.save(obj, memory)
    expected = memory.getvalue()

    writes: list[int] = []
    real_write = os.write

    def counting_write(fd, data):
        done = real_write(fd, data)
        writes.append(done)
        return done

    with monkeypatch.context() as patch:
        patch.setattr(os, "write", counting_write)
        tracemalloc.start()  # traces Python buffers (a BytesIO), not tensor storage
        try:
            save_checkpoint(obj, tmp_path / "checkpoint.pt")
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < len(expected) // 4  # never the whole 8 MiB archive in memory
    data = (tmp_path / "checkpoint.pt").read_bytes()
    # the same bytes and hash as an archive made in memory (resume and fingerprints agree)
    assert data[:-TRAILER_SIZE] == expected
    assert data[-TRAILER_SIZE:] == MAGIC + hashlib.sha256(expected).hexdigest().encode() + b"\n"
    assert sum(writes) == len(data)
    assert max(writes) <= state_module.WRITE_BUFFER < len(expected) // 4  # in pieces
    assert load_checkpoint(tmp_path / "checkpoint.pt", fallback=False)["round"] == 1


def ditto_runner(tmp_path, dataset, name="run", **settings) -> Runner:
    exp = prepare(cfg("ditto", clients_per_domain=2, **settings), dataset=dataset)
    return Runner(exp, tmp_path / name, progress=False)


def test_a_round_keeps_states_only_of_the_clients_it_calls(tmp_path, micro_digits, monkeypatch):
    """Without a checkpoint of the round before (checkpoint_every=2), the clients a round
    calls (half of them) are kept as they were, the others not at all."""
    runner = ditto_runner(tmp_path, micro_digits, fraction=0.5, checkpoint_every=2, rounds=2)
    kept: dict[int, dict] = {}
    called: dict[int, list[int]] = {}
    keep = Runner._keep_rollback

    def spy(self, before, ids):
        keep(self, before, ids)
        called.setdefault(self.fed.round, []).extend(ids)
        if self.fed.round == 2:
            kept.update(before)

    monkeypatch.setattr(Runner, "_keep_rollback", spy)
    runner.run()
    clients = len(runner.exp.contexts)
    assert clients == 6 and len(called[2]) == 3
    assert sorted(kept) == sorted(called[2])
    assert all(isinstance(state, dict) for state in kept.values())  # copies, not the checkpoint


def test_a_replaced_state_is_not_kept_when_the_checkpoint_holds_it(
    tmp_path, micro_digits, monkeypatch
):
    """With the checkpoint of round 1 on disk, a client's personal model of round 1 is
    freed as soon as its round-2 task replaces it (nothing holds it for the round)."""
    runner = ditto_runner(tmp_path, micro_digits, rounds=2)
    alive_after_task: list[bool] = []
    task = dispatch.run_client_task

    def watching(algorithm, ctx, name, sent, **options):
        old = ctx.state.get("personal")
        ref = weakref.ref(next(iter(old.values()))) if old else None
        del old
        reply = task(algorithm, ctx, name, sent, **options)
        if ref is not None:
            gc.collect()
            alive_after_task.append(ref() is not None)
        return reply

    monkeypatch.setattr(dispatch, "run_client_task", watching)
    runner.run()
    assert alive_after_task == [False] * len(runner.exp.contexts)


@pytest.mark.parametrize("checkpoint_every", [1, 2])
def test_a_failed_round_restores_the_states_it_changed(tmp_path, micro_digits, checkpoint_every):
    """A strict failure of client 1 in round 2 (client 0 trained first) puts every state
    back as it was after round 1: read back from the checkpoint of round 1
    (checkpoint_every=1) or from the copies kept in memory (checkpoint_every=2)."""
    clean = ditto_runner(tmp_path, micro_digits, "clean", rounds=1)
    clean.run()
    after_one = load_checkpoint(clean.checkpoint_path)["clients"]
    runner = ditto_runner(
        tmp_path,
        micro_digits,
        "strict",
        rounds=2,
        failure_policy="strict",
        faults="raise@2:1",
        checkpoint_every=checkpoint_every,
    )
    # without a checkpoint of round 1 the message says to run the same command again
    said = "client states kept as they were" if checkpoint_every == 1 else "first checkpoint"
    with pytest.raises(RoundFailed, match=said):
        runner.run()
    for cid, ctx in runner.exp.contexts.items():
        want = after_one[str(cid)]["personal"]
        assert ctx.state.keys() == {"personal"}
        assert all(torch.equal(ctx.state["personal"][k], v) for k, v in want.items()), cid


@pytest.mark.parametrize("privacy", [{}, {"dp_clip": 1.0, "dp_noise": 0.5}], ids=["mean", "dp"])
def test_replies_are_folded_into_the_mean_as_they_arrive(
    tmp_path, micro_digits, monkeypatch, privacy
):
    """A FedAvg-style round folds each reply's model into a running mean (or DP-FedAvg's
    running sum of clipped updates) before the next client runs, and lets go of it: when
    client k+1 trains, no earlier reply's model tensor is alive (before, every reply was
    held until the last one)."""
    runner = ditto_runner(tmp_path, micro_digits, rounds=1, **privacy)
    replies: list[weakref.ref] = []
    alive_when_next_runs: list[int] = []
    task = dispatch.run_client_task

    def watching(algorithm, ctx, name, sent, **options):
        gc.collect()
        alive_when_next_runs.append(sum(ref() is not None for ref in replies))
        reply = task(algorithm, ctx, name, sent, **options)
        replies.append(weakref.ref(next(iter(reply.arrays.values()))))
        return reply

    monkeypatch.setattr(dispatch, "run_client_task", watching)
    runner.run()
    assert len(alive_when_next_runs) == len(runner.exp.contexts) == 6
    assert alive_when_next_runs == [0] * 6
