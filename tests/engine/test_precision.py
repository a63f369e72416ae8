"""Mixed precision (run key ``precision``) and the channels_last memory format on the CPU:
every algorithm trains under bf16, weights and checkpoints stay fp32, bf16 runs resume
bit-exactly, fp16 trains with a loss scaler, fp32 (the default) autocasts nothing."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import FAST_SETTINGS, read_history

from fedshift.algorithms import REGISTRY
from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.toolkit import fit
from fedshift.cli import main
from fedshift.config import resolve
from fedshift.core.context import MixedPrecision, TrainConfig
from fedshift.core.state import load_checkpoint
from fedshift.engine.assembly import prepare
from fedshift.engine.compute import resolve_precision
from fedshift.engine.run.runner import Runner
from fedshift.pretrain import pretrain

#: the largest relative difference between the first round's train loss under bf16 and under
#: fp32 from the same start: bf16 keeps ~3 significant digits, so one or two steps move the
#: loss by well under 1 %; a loop that trains wrongly under autocast (or not at all) moves it
#: by far more. The loss is a sharper check than accuracy on a handful of test images.
LOSS_TOLERANCE = 0.05


def config(algorithm: str, tmp_path, dataset, **overrides):
    # half precision on the CPU runs the CPU's own kernels: the native numeric path
    base = {"rounds": 2, "batch_size": 32, "device": "cpu", "cpu_numerics": "native"}
    settings = {**base, **overrides}
    settings.update(FAST_SETTINGS.get(algorithm, {}))
    cls = REGISTRY[algorithm]
    if cls.needs_pretrained_backbone:
        path = tmp_path / "backbone-syn.pt"
        if not path.exists():
            pretrain(dataset, "syn", path, train=TrainConfig(batch_size=32), epochs=1)
        settings.update({"sources": "mnist,mnistm", "server_data": "syn", "algo.backbone": path})
    flags = {
        "algorithm": algorithm,
        "target": "optdigits",
        "protocol": (cls.protocols or ("lodo",))[0],
    }
    return resolve(None, flags, [f"{k}={v}" for k, v in settings.items()])


def run(tmp_path, name, algorithm, dataset, *, resume=False, stop_after=None, **overrides):
    exp = prepare(config(algorithm, tmp_path, dataset, **overrides), dataset=dataset)
    runner = Runner(exp, tmp_path / name, progress=False)
    return runner.run(resume=resume, stop_after=stop_after), runner


#: the client-side hooks of FedAvg's training step: an algorithm that inherits all of them
#: trains its clients exactly as FedAvg does and differs only on the server
CLIENT_STEP = ("train", "local_penalty", "batch_plan")


def trains_as_fedavg(algorithm: str) -> bool:
    cls = REGISTRY[algorithm]
    return cls is not FedAvg and all(getattr(cls, h) is getattr(FedAvg, h) for h in CLIENT_STEP)


@pytest.mark.parametrize(
    "algorithm",
    # FedAvg's own check covers the client step of the server-side variants (FedAvgM, the
    # adaptive server optimizers, centralized): their bf16 rounds are slow-tier
    [pytest.param(a, marks=pytest.mark.slow) if trains_as_fedavg(a) else a for a in REGISTRY],
)
def test_every_algorithm_trains_under_bf16(algorithm, tmp_path, nano16_digits):
    """One round with ``precision=bf16``: the contexts carry bf16, losses are finite, the
    first round's train loss is within ``LOSS_TOLERANCE`` of the same run's in fp32, and the
    checkpointed weights stay fp32 (the resume and the later rounds under bf16 are tested
    with FedAvg below; every algorithm's rounds beyond the first in tests/test_contract.py)."""
    fp32, _ = run(tmp_path, "fp32", algorithm, nano16_digits, rounds=1, batch_size=32)
    bf16, runner = run(
        tmp_path, "bf16", algorithm, nano16_digits, precision="bf16", rounds=1, batch_size=32
    )
    assert runner.exp.precision == MixedPrecision("bf16", "cpu")
    assert all(ctx.precision.name == "bf16" for ctx in runner.exp.contexts.values())
    assert bf16["failed_clients"] == 0, runner.fed.failures
    (low,) = read_history(tmp_path / "bf16")
    (full,) = read_history(tmp_path / "fp32")
    assert math.isfinite(low["train_loss"]), low
    assert low["train_loss"] != full["train_loss"]  # autocast reached the training loop
    assert abs(low["train_loss"] - full["train_loss"]) <= LOSS_TOLERANCE * abs(
        full["train_loss"]
    ), (low["train_loss"], full["train_loss"])
    ckpt = load_checkpoint(tmp_path / "bf16" / "checkpoint.pt")
    for name, tensor in ckpt["server"]["model"].items():
        if tensor.is_floating_point():
            assert tensor.dtype == torch.float32, name


def test_bf16_resume_is_bit_exact(tmp_path, nano16_digits):
    """A bf16 run stopped after round 1 and resumed ends exactly like a straight one."""
    straight, _ = run(tmp_path, "a", "fedavg", nano16_digits, precision="bf16")
    assert run(tmp_path, "b", "fedavg", nano16_digits, precision="bf16", stop_after=1)[0] == {}
    resumed, _ = run(tmp_path, "b", "fedavg", nano16_digits, precision="bf16", resume=True)
    assert resumed["target_accuracy"] == straight["target_accuracy"]
    first = load_checkpoint(tmp_path / "a" / "checkpoint.pt")["server"]["model"]
    second = load_checkpoint(tmp_path / "b" / "checkpoint.pt")["server"]["model"]
    for name, tensor in first.items():
        assert torch.equal(second[name], tensor), name


@pytest.mark.parametrize(
    "algorithm",
    # fp16 convolutions are slow on a CPU (minutes for Ditto's two models): Ditto is slow-tier
    ["fedavg", pytest.param("ditto", marks=pytest.mark.slow)],
)
def test_fp16_on_the_cpu_trains_with_a_loss_scaler(algorithm, tmp_path, nano16_digits):
    """torch autocasts to fp16 on the CPU; ``fit`` and the loops of their own (Ditto's)
    scale the loss, and a 1-round run ends with finite losses."""
    summary, _ = run(tmp_path, "fp16", algorithm, nano16_digits, precision="fp16", rounds=1)
    assert summary["failed_clients"] == 0
    for entry in read_history(tmp_path / "fp16"):
        assert math.isfinite(entry["train_loss"]), entry


def linear_fit(precision: MixedPrecision | None) -> tuple[list[torch.dtype], torch.nn.Linear]:
    """Two steps of ``fit`` on a linear model; the dtypes its logits had."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    dtypes = []

    def step_loss(x, y):
        logits = model(x)
        dtypes.append(logits.dtype)
        return F.cross_entropy(logits, y)

    batches = [(torch.randn(8, 4), torch.randint(3, (8,)))]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    fit(optimizer, 2, lambda: batches, step_loss, precision=precision)
    return dtypes, model


def test_fit_autocasts_the_forward_pass_and_keeps_fp32_weights():
    assert linear_fit(None)[0] == [torch.float32] * 2
    assert linear_fit(MixedPrecision())[0] == [torch.float32] * 2
    dtypes, model = linear_fit(MixedPrecision("bf16"))
    assert dtypes == [torch.bfloat16] * 2
    assert model.weight.dtype == torch.float32 and model.weight.grad.dtype == torch.float32
    dtypes, model = linear_fit(MixedPrecision("fp16"))
    assert dtypes == [torch.float16] * 2 and model.weight.dtype == torch.float32


def test_fp32_fit_matches_the_loop_without_precision():
    """The default path is the plain loop: same weights as no precision at all."""
    _, plain = linear_fit(None)
    _, fp32 = linear_fit(MixedPrecision("fp32"))
    assert torch.equal(plain.weight, fp32.weight) and torch.equal(plain.bias, fp32.bias)


def test_auto_precision_is_fp32_on_the_cpu():
    assert resolve_precision("auto", torch.device("cpu")) == MixedPrecision("fp32", "cpu")
    assert resolve_precision("bf16", torch.device("cpu")) == MixedPrecision("bf16", "cpu")


def test_channels_last_on_converts_conv_weights_and_auto_is_off_on_the_cpu(tiny_digits):
    def conv_weight(**settings):
        cfg = resolve(None, {"device": "cpu"}, [f"{k}={v}" for k, v in settings.items()])
        exp = prepare(cfg, dataset=tiny_digits)
        weight = next(p for p in exp.algorithm.run.build_model().parameters() if p.dim() == 4)
        return exp, weight

    exp, weight = conv_weight()
    assert exp.info["channels_last"] is False
    assert not weight.is_contiguous(memory_format=torch.channels_last)
    exp, weight = conv_weight(channels_last="on")
    assert exp.info["channels_last"] is True
    assert weight.is_contiguous(memory_format=torch.channels_last)


def test_dry_run_names_the_precision(capsys):
    argv = ["run", "--dry-run", "--set", "precision=bf16", "--set", "cpu_numerics=native"]
    assert main([*argv, "--device", "cpu"]) == 0
    assert (
        "# training: precision bf16 on cpu, 1 CPU thread; contiguous models"
        in capsys.readouterr().out
    )


def test_an_unknown_precision_is_one_line(capsys):
    assert main(["run", "--dry-run", "--set", "precision=fp8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fedshift: error: unknown precision 'fp8'") and "\n" not in err
