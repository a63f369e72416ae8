"""The batched (kornia) DomainBed augmentation against the PIL path: the same parameter
distributions, torchvision's semantics for the same parameters, seeding, and whole runs."""

from __future__ import annotations

import json
import math

import pytest
import torch

from fedshift.config import resolve
from fedshift.core.errors import ConfigError
from fedshift.data.augment import (
    BatchedDomainBedAugment,
    DomainBedAugment,
    FusedDomainBedAugment,
    build_augment,
    resolve_augment_backend,
)
from fedshift.data.domains import Domain, DomainDataset, Split
from fedshift.engine.assembly import prepare
from fedshift.engine.run.runner import Runner

SIZE = 224
DRAWS = 2000


def _images(n: int, size: int, seed: int = 0) -> torch.Tensor:
    """Smooth colour ramps with noise: images whose every colour step shows."""
    gen = torch.Generator().manual_seed(seed)
    ramp = torch.linspace(0, 1, size)
    base = torch.rand(n, 3, 1, 1, generator=gen) * 0.5 + 0.25 * (ramp[None, None] + ramp[:, None])
    noise = torch.rand(n, 3, size, size, generator=gen) * 0.2
    return ((base + noise).clamp(0, 1) * 255).round().to(torch.uint8)


@pytest.fixture(scope="module")
def batched_draws() -> list[dict[str, torch.Tensor]]:
    return BatchedDomainBedAugment(SIZE).draw(torch.Size((DRAWS, 3, SIZE, SIZE)), seed=11)


@pytest.fixture(scope="module")
def pil_draws() -> dict[str, torch.Tensor]:
    """The PIL path's own draws: torchvision's parameter functions, as its transforms call
    them, ``DRAWS`` times under a forked seeded RNG."""
    from torchvision import transforms as T

    image = torch.zeros(3, SIZE, SIZE)
    crops, jitter = [], []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(11)
        for _ in range(DRAWS):
            crops.append(T.RandomResizedCrop.get_params(image, [0.7, 1.0], [3 / 4, 4 / 3]))
            _, *factors = T.ColorJitter.get_params([0.7, 1.3], [0.7, 1.3], [0.7, 1.3], [-0.3, 0.3])
            jitter.append(factors)
            torch.rand(2)  # the flip's and the grayscale's draws
    crops_t = torch.tensor(crops, dtype=torch.float64)
    return {
        "area": crops_t[:, 2] * crops_t[:, 3] / SIZE**2,
        "jitter": torch.tensor(jitter, dtype=torch.float64),  # brightness, contrast, sat., hue
    }


def _crop_boxes(params: dict[str, torch.Tensor]) -> torch.Tensor:
    """(left, top, width, height) of each drawn crop."""
    src = params["src"].double()
    left, top = src[:, 0, 0], src[:, 0, 1]
    return torch.stack([left, top, src[:, 1, 0] - left + 1, src[:, 3, 1] - top + 1], 1)


def test_crop_draws_match_the_pil_path(batched_draws, pil_draws):
    box = _crop_boxes(batched_draws[0])
    area = box[:, 2] * box[:, 3] / SIZE**2
    assert area.min() >= 0.7 - 2 / SIZE and area.max() <= 1.0
    assert abs(area.mean() - pil_draws["area"].mean()) < 0.01
    assert abs(area.std() - pil_draws["area"].std()) < 0.01
    ratio = box[:, 2] / box[:, 3]
    assert ratio.min() >= 3 / 4 - 0.01 and ratio.max() <= 4 / 3 + 0.01
    assert box[:, :2].min() >= 0 and (box[:, 0] + box[:, 2]).max() <= SIZE
    assert (box[:, 1] + box[:, 3]).max() <= SIZE
    assert box[:, 0].max() > 0  # crops sit at random positions, not only the corner


def test_flip_gray_and_jitter_draws_match_the_pil_path(batched_draws, pil_draws):
    flips = batched_draws[1]["batch_prob"].double()
    grays = batched_draws[3]["batch_prob"].double()
    assert abs(flips.mean() - 0.5) < 0.04 and abs(grays.mean() - 0.1) < 0.025
    assert batched_draws[2]["batch_prob"].bool().all()  # the jitter applies to every image
    names = ("brightness_factor", "contrast_factor", "saturation_factor", "hue_factor")
    for column, name in enumerate(names):
        drawn = batched_draws[2][name].double()
        low, high = (-0.3, 0.3) if name == "hue_factor" else (0.7, 1.3)
        assert drawn.min() >= low and drawn.max() <= high, name
        reference = pil_draws["jitter"][:, column]
        assert abs(drawn.mean() - reference.mean()) < 0.015, name
        assert abs(drawn.std() - 0.6 / math.sqrt(12)) < 0.01, name  # uniform over the range
        assert abs(reference.std() - 0.6 / math.sqrt(12)) < 0.01, name
    assert sorted(batched_draws[2]["order"].tolist()) == [0, 1, 2, 3]


def test_pixels_follow_torchvision_for_the_drawn_parameters():
    """Each image, redone with torchvision's tensor kernels and the batch's drawn parameters
    (crop, flip, jitter in the drawn order, grayscale), gives the same pixels up to rounding."""
    from torchvision.transforms.v2 import functional as F

    augment = BatchedDomainBedAugment(48)
    images = _images(16, 48)
    params = augment.draw(images.shape, seed=3)
    out = augment.apply(images, params)
    crop, flip, jitter, gray = params
    adjust = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
    names = ("brightness_factor", "contrast_factor", "saturation_factor", "hue_factor")
    for i, (left, top, width, height) in enumerate(_crop_boxes(crop).long().tolist()):
        x = F.resized_crop(images[i].float() / 255, top, left, height, width, [48, 48])
        if flip["batch_prob"][i]:
            x = F.horizontal_flip(x)
        for step in jitter["order"].tolist():
            x = adjust[step](x, float(jitter[names[step]][i]))
        if gray["batch_prob"][i]:
            x = F.rgb_to_grayscale(x, num_output_channels=3)
        expected = (x * 255).round().clamp(0, 255)
        difference = (out[i].float() - expected).abs()
        assert difference.max() <= 2 and difference.mean() < 0.05, i


@pytest.mark.parametrize("backend", [BatchedDomainBedAugment, FusedDomainBedAugment])
def test_seeded_by_the_client_generator_only(backend):
    augment = backend(32)
    images = _images(8, 32)
    torch.manual_seed(5)
    global_state = torch.get_rng_state()
    first = augment(images, torch.Generator().manual_seed(1))
    assert torch.equal(torch.get_rng_state(), global_state)  # the global RNG is untouched
    assert torch.equal(first, augment(images, torch.Generator().manual_seed(1)))
    assert not torch.equal(first, augment(images, torch.Generator().manual_seed(2)))
    assert not torch.equal(first, images)
    generator = torch.Generator().manual_seed(1)
    augment(images, generator)
    assert not torch.equal(first, augment(images, generator))  # each batch a new seed


def test_output_dtype_shape_and_device():
    images = _images(5, 40)
    out = BatchedDomainBedAugment(40)(images, torch.Generator().manual_seed(0))
    assert out.dtype == torch.uint8 and out.shape == images.shape and out.device == images.device
    single = BatchedDomainBedAugment(40)(images[:1], torch.Generator().manual_seed(0))
    assert single.shape == (1, 3, 40, 40)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_batches_stay_on_the_device_with_the_cpu_draws():
    augment = BatchedDomainBedAugment(64)
    images = _images(16, 64)
    cuda_state = torch.cuda.get_rng_state()
    on_device = augment(images.cuda(), torch.Generator().manual_seed(4))
    assert on_device.device.type == "cuda" and on_device.dtype == torch.uint8
    assert torch.equal(torch.cuda.get_rng_state(), cuda_state)
    on_cpu = augment(images, torch.Generator().manual_seed(4))
    assert (on_device.cpu().float() - on_cpu.float()).abs().max() <= 2


def test_backend_resolution_and_choice():
    assert resolve_augment_backend("auto", torch.device("cuda")) == "batched"
    assert resolve_augment_backend("auto", torch.device("cpu")) == "pil"
    assert resolve_augment_backend("batched", torch.device("cpu")) == "batched"
    assert isinstance(build_augment("domainbed", 32, 3, "batched"), BatchedDomainBedAugment)
    assert isinstance(build_augment("domainbed", 32, 3, "pil"), DomainBedAugment)
    with pytest.raises(ConfigError, match="augment_backend"):
        resolve(None, {"algorithm": "fedavg"}, ["augment_backend=gpu"])


def _rgb_dataset() -> DomainDataset:
    """Three small RGB domains whose default augmentation is DomainBed's."""
    gen = torch.Generator().manual_seed(0)
    domains = {}
    for name in ("a", "b", "c"):
        splits = {}
        for split, count in (("train", 24), ("val", 8), ("test", 8)):
            x = torch.randint(0, 256, (count, 3, 32, 32), dtype=torch.uint8, generator=gen)
            splits[split] = Split(x=x, y=torch.arange(count) % 4)
        domains[name] = Domain(name=name, **splits)
    meta = {"augment": "domainbed"}
    return DomainDataset("rgb", domains, ["w", "x", "y", "z"], 3, 32, meta)


@pytest.mark.parametrize("backend", ["batched", "fused", "pil"])
def test_one_round_run_with_each_backend(backend, tmp_path):
    settings = ["rounds=1", "batch_size=8", "device=cpu", "target=c", "threads=1"]
    settings += ["augment=domainbed", f"augment_backend={backend}", "tracking=none"]
    exp = prepare(resolve(None, {"algorithm": "fedavg"}, settings), dataset=_rgb_dataset())
    Runner(exp, tmp_path / "run", progress=False).run()
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["augment_backend"] == backend
    assert config["run_info"]["inputs"]["augment_backend"] == backend
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 1
