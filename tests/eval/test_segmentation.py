"""The segmentation problem: soft and hard Dice (exact numbers), the U-Net, the configuration
checks of ``problem``, and FedAvg and FedDG-ELCFS segmentation runs reporting Dice."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import cfg, read_history, run

from fedshift.core.errors import ConfigError
from fedshift.eval.segmentation import dice_per_image, soft_dice_loss
from fedshift.models import build_model


def test_soft_dice_loss_and_hard_dice_exact():
    probs = torch.tensor([[[[1.0, 0.5], [0.0, 0.0]]]])
    target = torch.tensor([[[[1.0, 1.0], [0.0, 0.0]]]])
    smooth = 1e-5
    expected = 1 - (2 * 1.5 + smooth) / (1.5 + 2.0 + smooth)
    assert float(soft_dice_loss(probs, target)) == pytest.approx(expected, abs=1e-7)
    pred = torch.tensor([[[1, 0], [1, 0]], [[0, 0], [0, 0]]])
    truth = torch.tensor([[[1, 1], [0, 0]], [[0, 0], [0, 0]]])
    torch.testing.assert_close(dice_per_image(pred, truth), torch.tensor([0.5, 1.0]))


def test_unet_shapes():
    torch.manual_seed(0)
    model = build_model("unet", 10, in_channels=3, image_size=32).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert model.features(x).shape == (2, 16, 32, 32)
        assert model(x).shape == (2, 1, 32, 32)
    assert all(k.startswith(("backbone.", "head.")) for k in model.state_dict())
    with pytest.raises(ValueError, match="divisible by 8"):
        build_model("unet", 10, image_size=28)


@pytest.mark.parametrize(
    ("algorithm", "settings", "message"),
    [
        ("fedavg", {"problem": "segmentation"}, "needs a segmentation model"),
        ("ditto", {"problem": "segmentation", "model": "unet"}, "does not support problem"),
        ("fedavg", {"model": "unet"}, "use it with problem=segmentation"),
        ("fedavg", {"problem": "detection"}, "unknown problem"),
        ("fedavg", {"task": "detection"}, "unknown problem"),  # the old key name still works
    ],
)
def test_problem_errors(algorithm, settings, message):
    with pytest.raises(ConfigError, match=message):
        cfg(algorithm, **settings)


def test_elcfs_and_fedavg_segment(tmp_path, tiny_digits):
    settings = {"problem": "segmentation", "model": "unet", "rounds": 1, "sources": "mnist,syn"}
    for algorithm in ("fedavg", "feddg-elcfs"):
        summary, runner = run(tmp_path, algorithm, tiny_digits, algorithm, **settings)
        assert 0.0 <= summary["target_dice"] <= 1.0
        assert summary["target_dice"] == summary["target_accuracy"]
        assert set(summary["per_domain_dice"]) == set(tiny_digits.domain_names)
        history = read_history(runner.out)
        assert all(math.isfinite(h["train_loss"]) for h in history)
