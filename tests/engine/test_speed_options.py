"""Options that cut per-round cost at scale: ``checkpoint_every`` (resume still bit-exact),
``personal_eval_every``, ``eval_batch_size`` (auto: by device and image size), ``threads``
(0: one thread, whatever the load), and a model builder that reuses modules."""

from __future__ import annotations

import io

import pytest
import torch
from helpers import cfg, read_history

from fedshift.algorithms.toolkit import model_from_record, state_dict_cpu
from fedshift.core.errors import ConfigError
from fedshift.core.record import Record
from fedshift.core.state import load_checkpoint
from fedshift.engine.assembly import prepare
from fedshift.engine.evaluation import auto_eval_batch, eval_batch, personal_eval_every
from fedshift.engine.run.runner import Runner, check_resume_config


def run(tmp_path, name, dataset, algorithm, **kw):
    settings = kw.pop("settings", {})
    exp = prepare(cfg(algorithm, **{"rounds": 4, **settings}), dataset=dataset)
    return Runner(exp, tmp_path / name, progress=False).run(**kw)


def without_timing(rows):
    return [{k: v for k, v in row.items() if k not in ("seconds", "cpu_seconds")} for row in rows]


@pytest.mark.parametrize("algorithm", ["fedavg", "ditto"])
def test_checkpoint_every_n_rounds_resumes_bit_exact(tmp_path, micro_digits, algorithm):
    """Killed after round 3 with a checkpoint every 2 rounds: the resumed run replays round 3
    from the round-2 checkpoint and ends identical to a straight run."""
    every = {"checkpoint_every": 2}
    straight = run(tmp_path, "a", micro_digits, algorithm, settings=every)
    assert run(tmp_path, "b", micro_digits, algorithm, settings=every, stop_after=3) == {}
    assert load_checkpoint(tmp_path / "b" / "checkpoint.pt")["round"] == 2
    resumed = run(tmp_path, "b", micro_digits, algorithm, settings=every, resume=True)
    assert resumed["target_accuracy"] == straight["target_accuracy"]
    a = without_timing(read_history(tmp_path / "a"))
    assert a == without_timing(read_history(tmp_path / "b"))
    assert len(a) == 4
    final_a = load_checkpoint(tmp_path / "a" / "checkpoint.pt")
    final_b = load_checkpoint(tmp_path / "b" / "checkpoint.pt")
    assert final_a["round"] == final_b["round"] == 4
    for name, tensor in final_a["server"]["model"].items():
        assert torch.equal(final_b["server"]["model"][name], tensor)
    for cid, state in final_a["clients"].items():
        for key, weights in state.items():
            for name, tensor in weights.items():
                assert torch.equal(final_b["clients"][cid][key][name], tensor)
    assert any(final_a["clients"].values()) == (algorithm == "ditto")


def test_personal_models_scored_every_n_rounds_and_in_the_last(tmp_path, micro_digits):
    run(tmp_path, "d", micro_digits, "ditto", settings={"personal_eval_every": 3})
    rows = read_history(tmp_path / "d")
    assert ["personalized_accuracy" in row for row in rows] == [False, False, True, True]
    assert all("target_accuracy" in row for row in rows)


def test_personal_eval_every_default_follows_the_number_of_clients():
    base = cfg("ditto")
    assert personal_eval_every(base, 12) == 1
    assert personal_eval_every(base, 600) == 10
    assert personal_eval_every(cfg("ditto", personal_eval_every=4), 12) == 4


def test_eval_batch_size_does_not_change_accuracy(tmp_path, micro_digits):
    plain = run(tmp_path, "p", micro_digits, "fedavg", settings={"rounds": 1})
    small = run(tmp_path, "s", micro_digits, "fedavg", settings={"rounds": 1, "eval_batch_size": 7})
    assert plain["per_domain_accuracy"] == small["per_domain_accuracy"]


def test_auto_eval_batch_is_small_for_large_images_on_the_cpu_and_large_on_a_gpu():
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert auto_eval_batch(cpu, 224) == 256
    assert auto_eval_batch(cpu, 128) == 256
    assert auto_eval_batch(cpu, 32) == 1000
    assert auto_eval_batch(gpu, 224) == auto_eval_batch(gpu, 32) == 1024


def test_eval_batch_follows_the_split_unless_set(micro_digits):
    test = micro_digits.domain("mnist").test
    side = test.x.shape[-1]
    assert eval_batch(cfg("fedavg"), torch.device("cpu"), test) == auto_eval_batch(
        torch.device("cpu"), side
    )
    assert eval_batch(cfg("fedavg", eval_batch_size=7), torch.device("cpu"), test) == 7


#: /proc/loadavg of an idle machine and of the busy 2-core machine of issue 35
IDLE, BUSY = "0.00 0.01 0.05 1/190 4242\n", "6.50 5.90 4.80 9/190 4242\n"


@pytest.mark.parametrize("loadavg", [IDLE, BUSY], ids=["idle", "busy"])
def test_threads_zero_is_one_thread_on_an_idle_and_a_busy_machine(
    loadavg, monkeypatch, micro_digits
):
    """The same command uses the same thread count (so gives the same numbers) whatever
    else runs: before, threads=0 read /proc/loadavg and took a thread per free core (2 on
    an idle 2-core machine, 1 on a busy one). A number in the config wins."""
    real_open = open

    def fake_open(file, *args, **kwargs):
        if str(file) == "/proc/loadavg":
            return io.StringIO(loadavg)
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        exp = prepare(cfg("fedavg"), dataset=micro_digits)
        assert torch.get_num_threads() == exp.info["threads"] == 1
        exp = prepare(cfg("fedavg", threads=2), dataset=micro_digits)
        assert torch.get_num_threads() == exp.info["threads"] == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize(
    "setting",
    ["checkpoint_every=0", "personal_eval_every=-1", "vectorize=fast", "eval_batch_size=-2"],
)
def test_bad_values_are_config_errors(setting):
    key, value = setting.split("=")
    with pytest.raises(ConfigError, match=key):
        cfg("fedavg", **{key: value})


def test_a_checkpoint_from_before_the_new_keys_still_resumes():
    now = cfg("fedavg")
    saved = now.to_dict()
    for key in ("checkpoint_every", "personal_eval_every", "eval_batch_size", "vectorize"):
        del saved[key]
    check_resume_config(saved, now)


def test_leased_models_are_distinct_in_a_call_and_reused_after_it(micro_digits):
    exp = prepare(cfg("fedavg"), dataset=micro_digits)
    ctx = next(iter(exp.contexts.values()))
    sent = Record().with_arrays("model", state_dict_cpu(ctx.build_model()))
    with ctx.build_model.leasing():
        first = model_from_record(ctx, sent)
        second = model_from_record(ctx, sent)
        assert first is not second
        next(first.parameters()).requires_grad_(False)
        first.eval()
        first(torch.zeros(2, 3, 32, 32)).sum()
    with ctx.build_model.leasing():
        again = model_from_record(ctx, sent)
        assert again is first or again is second
        assert all(p.requires_grad and p.grad is None for p in again.parameters())
        assert again.training
    assert model_from_record(ctx, sent) not in (first, second)
