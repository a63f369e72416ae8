"""The fused DomainBed augmentation (``augment_backend=fused``): seeding, the identity and
the single steps, torchvision's pixels for the drawn parameters, and DomainBed's parameter
ranges checked over many draws with fixed seeds."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from fedshift.data.augment import FusedDomainBedAugment, build_augment

SIZE = 224
DRAWS = 4000
#: no crop, no flip, no jitter, no grayscale
STILL = {
    "scale": (1.0, 1.0),
    "ratio": (1.0, 1.0),
    "flip": 0.0,
    "brightness": 0.0,
    "contrast": 0.0,
    "saturation": 0.0,
    "hue": 0.0,
    "grayscale": 0.0,
}


def _images(n: int, size: int, seed: int = 0, width: int | None = None) -> torch.Tensor:
    """Smooth colour ramps with noise: images whose every colour step shows."""
    gen = torch.Generator().manual_seed(seed)
    width = width or size
    rows, cols = torch.linspace(0, 1, size), torch.linspace(0, 1, width)
    base = torch.rand(n, 3, 1, 1, generator=gen) * 0.5 + 0.25 * (rows[:, None] + cols[None])
    noise = torch.rand(n, 3, size, width, generator=gen) * 0.2
    return ((base + noise).clamp(0, 1) * 255).round().to(torch.uint8)


@pytest.fixture(scope="module")
def draws() -> dict[str, torch.Tensor]:
    return FusedDomainBedAugment(SIZE).draw(torch.Size((DRAWS, 3, SIZE, SIZE)), seed=11)


def test_no_crop_flip_or_jitter_is_the_identity():
    images = _images(6, 40)
    out = FusedDomainBedAugment(40, **STILL)(images, torch.Generator().manual_seed(0))
    assert (out.int() - images.int()).abs().max() <= 1


def test_flip_flips():
    images = _images(6, 40)
    out = FusedDomainBedAugment(40, **{**STILL, "flip": 1.0})(images, torch.Generator())
    assert (out.int() - images.flip(-1).int()).abs().max() <= 1


def test_grayscale_makes_the_channels_equal():
    images = _images(6, 40)
    out = FusedDomainBedAugment(40, grayscale=1.0)(images, torch.Generator().manual_seed(3))
    assert torch.equal(out[:, 0], out[:, 1]) and torch.equal(out[:, 1], out[:, 2])
    plain = FusedDomainBedAugment(40, **{**STILL, "grayscale": 1.0})(images, torch.Generator())
    luma = 0.2989 * images[:, 0] + 0.587 * images[:, 1] + 0.114 * images[:, 2]
    assert (plain[:, 0].float() - luma).abs().max() <= 0.5 + 1e-3


def test_output_shape_dtype_and_device():
    images = _images(5, 40)
    out = FusedDomainBedAugment(40)(images, torch.Generator().manual_seed(0))
    assert out.dtype == torch.uint8 and out.shape == images.shape and out.device == images.device
    assert FusedDomainBedAugment(40)(images[:1], torch.Generator()).shape == (1, 3, 40, 40)
    wide = _images(3, 30, width=50)  # the crop is drawn on the input, resized to image_size
    assert FusedDomainBedAugment(24)(wide, torch.Generator()).shape == (3, 3, 24, 24)
    assert isinstance(build_augment("domainbed", 32, 3, "fused"), FusedDomainBedAugment)


def test_crop_ranges_match_domainbed_and_torchvision(draws):
    """scale 0.7-1 and ratio 3/4-4/3 as RandomResizedCrop draws them (torchvision's own
    get_params, same number of draws, for the mean and spread of the area)."""
    from torchvision import transforms as T

    left, top, width, height = draws["crop"].unbind(1)
    area = width * height / SIZE**2
    assert area.min() >= 0.7 - 2 / SIZE and area.max() <= 1.0
    ratio = width / height
    assert ratio.min() >= 3 / 4 - 0.01 and ratio.max() <= 4 / 3 + 0.01
    assert left.min() >= 0 and (left + width).max() <= SIZE
    assert top.min() >= 0 and (top + height).max() <= SIZE
    assert left.max() > 0 and top.max() > 0  # at random positions, not only the corner
    assert torch.equal(draws["crop"], draws["crop"].round())  # whole pixels, as torchvision
    image = torch.zeros(3, SIZE, SIZE)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        boxes = [
            T.RandomResizedCrop.get_params(image, [0.7, 1.0], [3 / 4, 4 / 3]) for _ in range(DRAWS)
        ]
    reference = torch.tensor(boxes, dtype=torch.float64)
    reference_area = reference[:, 2] * reference[:, 3] / SIZE**2
    assert abs(area.mean() - reference_area.mean()) < 0.01
    assert abs(area.std() - reference_area.std()) < 0.01
    log_ratio = torch.log(ratio)
    reference_log = torch.log(reference[:, 3] / reference[:, 2])
    assert abs(log_ratio.mean() - reference_log.mean()) < 0.02
    assert abs(log_ratio.std() - reference_log.std()) < 0.02


def test_flip_jitter_and_grayscale_ranges(draws):
    assert abs(draws["flip"].double().mean() - 0.5) < 0.03
    assert abs(draws["grayscale"].double().mean() - 0.1) < 0.02
    for name in ("brightness", "contrast", "saturation", "hue"):
        values = draws[name]
        low, high = (-0.3, 0.3) if name == "hue" else (0.7, 1.3)
        assert values.min() >= low and values.max() <= high, name
        assert abs(values.mean() - (low + high) / 2) < 0.01, name
        assert abs(values.std() - 0.6 / math.sqrt(12)) < 0.01, name  # uniform over the range
        assert values.min() < low + 0.01 and values.max() > high - 0.01, name
    assert sorted(draws["order"].tolist()) == [0, 1, 2, 3]
    # the jitter's order, one per batch, is uniform over the 24 permutations across batches
    augment = FusedDomainBedAugment(8)
    shape = torch.Size((1, 3, 8, 8))
    orders = Counter(tuple(augment.draw(shape, seed)["order"].tolist()) for seed in range(2400))
    assert len(orders) == 24 and min(orders.values()) > 60 and max(orders.values()) < 140


def test_pixels_follow_torchvision_for_the_drawn_parameters():
    """Each image, redone with torchvision's tensor kernels and the drawn parameters (crop,
    flip, jitter in the batch's order, grayscale), gives the same pixels up to rounding."""
    from torchvision.transforms.v2 import functional as F

    augment = FusedDomainBedAugment(48, grayscale=0.3)
    images = _images(24, 48)
    params = augment.draw(images.shape, seed=3)
    assert params["grayscale"].any() and params["flip"].any() and not params["flip"].all()
    out = augment.apply(images, params)
    adjust = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
    names = ("brightness", "contrast", "saturation", "hue")
    for i, (left, top, width, height) in enumerate(params["crop"].long().tolist()):
        x = F.resized_crop(images[i].float() / 255, top, left, height, width, [48, 48])
        if params["flip"][i]:
            x = F.horizontal_flip(x)
        for step in params["order"].tolist():
            x = adjust[step](x, float(params[names[step]][i]))
        if params["grayscale"][i]:
            x = F.rgb_to_grayscale(x, num_output_channels=3)
        expected = (x * 255).round().clamp(0, 255)
        difference = (out[i].float() - expected).abs()
        assert difference.max() <= 1 and difference.mean() < 0.01, i


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_stay_on_the_device_with_the_cpu_draws():
    augment = FusedDomainBedAugment(64)
    images = _images(16, 64)
    cuda_state = torch.cuda.get_rng_state()
    on_device = augment(images.cuda(), torch.Generator().manual_seed(4))
    assert on_device.device.type == "cuda" and on_device.dtype == torch.uint8
    assert torch.equal(torch.cuda.get_rng_state(), cuda_state)
    on_cpu = augment(images, torch.Generator().manual_seed(4))
    assert (on_device.cpu().float() - on_cpu.float()).abs().max() <= 2
