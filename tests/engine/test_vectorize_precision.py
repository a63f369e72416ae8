"""A reduced precision keeps clients off the vectorized path: ``torch.func.vmap`` does not
autocast convolutions (the canary below), so ``vectorize`` (auto or on) runs the clients
sequentially, where their forward passes do autocast, and ``--dry-run`` says so."""

from __future__ import annotations

import logging

import torch
from torch.func import functional_call, vmap

from fedshift.cli import main
from fedshift.config import resolve
from fedshift.core.record import Record
from fedshift.engine.assembly import prepare
from fedshift.engine.simulation.dispatch import SimulationFederation
from fedshift.engine.simulation.vectorized import (
    run_vectorized,
    vectorize_blocker,
    vectorize_enabled,
)

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_vmap_does_not_autocast_a_convolution():
    """The reason for the fallback. If a torch release makes this fail (the vmapped
    convolution comes out bf16), vmap autocasts convolutions and the vectorized path could
    honour bf16: revisit ``vectorize_blocker``."""
    conv = torch.nn.Conv2d(3, 4, 3)
    params = {k: torch.stack([v.detach()] * 2) for k, v in conv.named_parameters()}
    x = torch.randn(2, 5, 3, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert conv(x[0]).dtype == torch.bfloat16
        out = vmap(lambda p, xb: functional_call(conv, p, (xb,)))(params, x)
    assert out.dtype == torch.float32


def test_reduced_precision_or_compile_turns_vectorize_off():
    assert vectorize_enabled("auto", CUDA, "fp32")
    assert not vectorize_enabled("auto", CUDA, "bf16")
    assert not vectorize_enabled("on", CPU, "fp16")
    assert not vectorize_enabled("on", CPU, "fp32", compile=True)
    assert vectorize_enabled("on", CPU, "fp32")
    assert vectorize_blocker("fp32") is None
    assert "autocast" in vectorize_blocker("bf16")


def test_bf16_with_vectorize_on_trains_sequentially_in_bf16(tiny_digits, caplog):
    options = {"algorithm": "fedavg", "target": "mnistm", "rounds": 1, "clients_per_domain": 2}
    sets = ["device=cpu", "threads=1", "precision=bf16", "vectorize=on", "cpu_numerics=native"]
    exp = prepare(resolve(None, options, sets), dataset=tiny_digits)
    with caplog.at_level(logging.WARNING):
        fed = SimulationFederation.for_experiment(exp)
    assert not fed.vectorize
    assert "vectorize=on: clients run sequentially; precision bf16" in caplog.text
    fed.begin_round(1)
    sent = Record().with_arrays("model", exp.algorithm.init_state().model)
    ids = fed.sample()
    sends = {cid: sent for cid in ids}
    kwargs = {"seed": 0, "round_": 1, "call_index": 0, "total_rounds": 1}
    assert run_vectorized(exp.algorithm, exp.contexts, "train", sends, **kwargs) is None
    # every client model is a copy of the template: a hook on its first convolution is in
    # each copy and sees the dtype the training forward pass runs in
    template = exp.contexts[ids[0]].build_model.template
    conv = next(m for m in template.modules() if isinstance(m, torch.nn.Conv2d))
    dtypes = []
    conv.register_forward_hook(lambda module, args, out: dtypes.append(out.dtype))
    replies = fed.call("train", ids, sent)
    assert len(replies) == len(ids) >= 4
    assert dtypes and set(dtypes) == {torch.bfloat16}
    for reply in replies.values():
        assert all(v.dtype == torch.float32 for v in reply.arrays.values() if v.is_floating_point())


def test_dry_run_says_why_clients_run_sequentially(capsys):
    args = ["run", "--dry-run", "--device", "cpu", "--set", "threads=1", "--set", "vectorize=on"]
    assert main([*args, "--set", "precision=bf16", "--set", "cpu_numerics=native"]) == 0
    out = capsys.readouterr().out
    assert "# clients: sequential (vectorize=on, but precision bf16: vmap does not" in out
    assert main(args) == 0
    assert "# clients: vectorized where a task allows (vectorize=on)" in capsys.readouterr().out
    assert main(args[:-2]) == 0
    assert "# clients: sequential (vectorize=auto on cpu)" in capsys.readouterr().out
