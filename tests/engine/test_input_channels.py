"""The run keys ``input_channels`` and ``normalize=mnist`` end to end: every model a run
builds (clients, server, evaluation, ``hetero_models`` variants, a resumed run's) takes one
channel, ``config.json`` records both keys, and bad values are one-line errors."""

from __future__ import annotations

import json

import pytest
import torch
from helpers import personalized_cfg, read_history

from fedshift.cli import main
from fedshift.core.errors import ConfigError
from fedshift.core.split import Split
from fedshift.data.domains import Domain, DomainDataset
from fedshift.engine.assembly import prepare
from fedshift.engine.run.runner import Runner

CLASSES = 4


def _gray_split(per_class: int, seed: int) -> Split:
    """28-px gray images stored as 3 identical channels (as Digit-Five's MNIST)."""
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(CLASSES).repeat_interleave(per_class)
    base = (y.view(-1, 1, 1, 1).float() * 60).expand(-1, 1, 28, 28)
    noise = torch.randint(0, 40, base.shape, generator=gen).float()
    gray = (base + noise).clamp(0, 255).to(torch.uint8)
    return Split(x=gray.expand(-1, 3, -1, -1).contiguous(), y=y)


@pytest.fixture(scope="module")
def gray_digits() -> DomainDataset:
    return DomainDataset(
        name="gray",
        domains={"a": Domain("a", _gray_split(24, 0), _gray_split(4, 1), _gray_split(6, 2))},
        classes=[str(c) for c in range(CLASSES)],
        channels=3,
        image_size=28,
    )


def gray_cfg(rounds: int = 1, **sets):
    """A short fedproto run on one input channel with MNIST's normalization."""
    keys = {"model": "fedproto-cnn", "input_channels": 1, "normalize": "mnist", **sets}
    return personalized_cfg("fedproto", threads=1, rounds=rounds, **keys)


def test_a_fedproto_run_with_one_input_channel_and_mnist_normalization(tmp_path, gray_digits):
    exp = prepare(gray_cfg(hetero_models="fedproto"), dataset=gray_digits)
    summary = Runner(exp, tmp_path / "r", progress=False).run()
    assert 0.0 <= summary["personalized_accuracy"] <= 1.0
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["input_channels"] == 1 and config["normalize"] == "mnist"
    assert config["run_info"]["inputs"]["normalize"] == "mnist"
    built = [exp.algorithm.run.build_model()] + [c.build_model() for c in exp.contexts.values()]
    for model in built:
        assert model.backbone.conv1.in_channels == 1
        assert model.gray_input and model.input_normalization == "mnist"
    # the hetero_models variants (conv2 of 18/20/22 channels) all take one channel
    states = [ctx.state["model"] for ctx in exp.contexts.values()]
    assert {s["backbone.conv1.weight"].shape[1] for s in states} == {1}
    assert [s["backbone.conv2.weight"].shape[0] for s in states] == [18, 20, 22]


def test_a_run_with_one_input_channel_resumes_to_a_straight_runs_numbers(tmp_path, gray_digits):
    straight = Runner(prepare(gray_cfg(2), dataset=gray_digits), tmp_path / "a", progress=False)
    first = Runner(prepare(gray_cfg(1), dataset=gray_digits), tmp_path / "b", progress=False)
    first.run()
    extended = Runner(prepare(gray_cfg(2), dataset=gray_digits), tmp_path / "b", progress=False)
    ours = extended.run(resume=True)
    reference = straight.run()
    assert ours["personalized_accuracy"] == reference["personalized_accuracy"]

    def untimed(run: str) -> list[dict]:
        rows = read_history(tmp_path / run)
        timed = ("seconds", "time")
        return [{k: v for k, v in r.items() if not any(t in k for t in timed)} for r in rows]

    assert untimed("b") == untimed("a")


def test_the_defaults_build_the_datasets_channels_unnormalized(gray_digits):
    exp = prepare(gray_cfg(input_channels=0, normalize="auto"), dataset=gray_digits)
    model = exp.algorithm.run.build_model()
    assert model.backbone.conv1.in_channels == 3
    assert not model.gray_input and model.input_normalization == "symmetric"
    assert not model.backbone._forward_pre_hooks


@pytest.mark.parametrize(
    "settings, message",
    [
        (["input_channels=2"], "input_channels must be in [0, 1], got 2"),
        (["input_channels=-1"], "input_channels must be in [0, 1], got -1"),
        (["input_channels=gray"], "input_channels expects int, got 'gray'"),
        (["normalize=mnsit"], "unknown normalize 'mnsit' (did you mean 'mnist'?)"),
        (
            ["input_channels=1", "normalize=imagenet"],
            "normalize=imagenet needs 3 input channels, got 1 (input_channels=1)",
        ),
    ],
)
def test_bad_values_are_one_line_errors(in_tmp, capsys, settings, message):
    argv = ["run", "-t", "optdigits", "--rounds", "1", "--quiet", "--set", "device=cpu"]
    for item in settings:
        argv += ["--set", item]
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith("fedshift: error: "), err
    assert message in err[0]
    assert not (in_tmp / "runs").exists()


def test_the_keys_are_checked_when_a_config_is_resolved():
    with pytest.raises(ConfigError, match=r"input_channels must be in \[0, 1\], got 3"):
        gray_cfg(input_channels=3)
