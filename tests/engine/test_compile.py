"""``compile=true``: models built for a run are compiled in place (``nn.Module.compile``), so
replies and checkpoints keep the eager models' keys and a compiled run resumes; a missing
toolchain is one line at startup (exit 2)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import cfg, read_history

from fedshift.cli import main
from fedshift.core.state import load_checkpoint
from fedshift.engine import compute
from fedshift.engine.assembly import ModelBuilder, prepare
from fedshift.engine.compute import compile_problem
from fedshift.engine.run.runner import Runner
from fedshift.models import build_model

CPU_PROBLEM = compile_problem(torch.device("cpu"))


def keys(tree) -> object:
    """The nested key structure of a checkpoint (values dropped)."""
    if isinstance(tree, dict):
        return {k: keys(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return [keys(v) for v in tree]
    return type(tree).__name__


def test_a_compiled_build_keeps_the_state_dict_keys():
    template = build_model("cnn", 10, in_channels=3, image_size=32)
    model = ModelBuilder(template, compile=True)()
    assert model._compiled_call_impl is not None  # compiled in place, not wrapped
    assert list(model.state_dict()) == list(template.state_dict())
    assert ModelBuilder(template)()._compiled_call_impl is None


def test_compile_is_off_by_default():
    assert cfg("fedavg").compile is False


def test_a_missing_compiler_is_one_line_at_startup(monkeypatch, capsys):
    monkeypatch.setattr(compute, "compile_problem", lambda device: "no C++ compiler (test)")
    args = ["run", "--dry-run", "--device", "cpu", "--set", "compile=true", "--set", "threads=1"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "fedshift: error: compile=true: no C++ compiler (test); run with --set compile=false"
    )


def test_dry_run_names_compile(capsys):
    args = ["run", "--dry-run", "--device", "cpu", "--set", "threads=1"]
    assert main([*args, "--set", "compile=true"]) == (2 if CPU_PROBLEM else 0)
    if not CPU_PROBLEM:
        assert "contiguous models; compiled (torch.compile)" in capsys.readouterr().out
    assert main(args) == 0
    assert "contiguous models; eager" in capsys.readouterr().out


@pytest.mark.slow  # the first inductor compile of the training step takes minutes on a CPU
@pytest.mark.skipif(CPU_PROBLEM is not None, reason=f"compile=true cannot run: {CPU_PROBLEM}")
def test_a_compiled_run_trains_keeps_checkpoint_keys_and_resumes(tmp_path, micro_digits):
    """2 rounds of FedAvg with compile=true, stopped after round 1 and resumed: finite
    losses, and a checkpoint with exactly the keys (no ``_orig_mod.``) of the same run
    in eager mode. Compiling takes minutes on a busy 2-core CPU."""
    settings = {"threads": 1, "eval_batch_size": 16}

    def runner(name, **more):
        exp = prepare(cfg("fedavg", **settings, **more), dataset=micro_digits)
        return Runner(exp, tmp_path / name, progress=False)

    eager = runner("eager").run()
    assert runner("compiled", compile="true").run(stop_after=1) == {}
    resumed_runner = runner("compiled", compile="true")
    model = resumed_runner.exp.contexts[0].build_model()
    assert model._compiled_call_impl is not None
    resumed = resumed_runner.run(resume=True)
    assert resumed["rounds"] == eager["rounds"] == 2
    history = read_history(tmp_path / "compiled")
    assert [row["round"] for row in history] == [1, 2]
    assert all(math.isfinite(row["train_loss"]) for row in history)
    compiled_ckpt = load_checkpoint(tmp_path / "compiled" / "checkpoint.pt")
    eager_ckpt = load_checkpoint(tmp_path / "eager" / "checkpoint.pt")
    assert keys(compiled_ckpt["server"]) == keys(eager_ckpt["server"])
    assert keys(compiled_ckpt["clients"]) == keys(eager_ckpt["clients"])
    assert not any("_orig_mod" in k for k in compiled_ckpt["server"]["model"])
    for name, tensor in compiled_ckpt["server"]["model"].items():
        assert torch.isfinite(tensor.float()).all(), name
