"""Training-time augmentation of image batches (the ``augment`` and ``augment_backend`` run keys).

``domainbed`` is DomainBed's training augmentation for its photo datasets (Gulrajani and
Lopez-Paz, ICLR 2021): RandomResizedCrop to the stored size with scale (0.7, 1.0) and ratio
(3/4, 4/3), a horizontal flip, ColorJitter(0.3, 0.3, 0.3, 0.3) in a random order and
RandomGrayscale(0.1), drawn per image. The crop is taken from the decoded image (224 px for
the catalog datasets), not from the original file. It has two backends (``augment_backend``):

- ``pil`` (:class:`DomainBedAugment`): ``torchvision.transforms.v2`` image by image on PIL
  images, as in DomainBed (each cached uint8 row is wrapped as one, then turned back into a
  tensor) on one CPU thread: PIL's colour kernels are about twice as fast as torchvision's
  tensor ones (hue: 3.2 vs 6.4 ms per 224 px image). A CUDA batch goes to the host and back.
- ``batched`` (:class:`BatchedDomainBedAugment`): kornia's augmentation modules on the whole
  uint8 batch at once, on the batch's device (CPU or CUDA), each image with its own random
  parameters (``same_on_batch=False``), computed in float32 in [0, 1] and rounded back to
  uint8 once. On the CPU it is slower than ``pil`` (float32 HSV round trip for the hue step
  against PIL's 8-bit kernels; ``docs/speed.md``), so ``auto`` picks ``batched`` on CUDA and
  ``pil`` on the CPU. (``torchvision.transforms.v2`` applied to a batch tensor draws one set
  of parameters for the whole batch, checked with torchvision 0.29, hence kornia.)

Deviation notes (``batched`` against torchvision's PIL path; the parameter ranges are the same):

- ColorJitter's order of brightness, contrast, saturation and hue is drawn once per batch
  (kornia draws one permutation per call), not once per image: over many batches each image's
  order is still uniform over the 24 permutations, but the images of one batch share it.
- Pixels are computed in float and rounded to uint8 once at the end; PIL rounds to uint8
  after every step, takes the contrast step's grey mean as a rounded integer, shifts hue in
  an 8-bit HSV image (steps of 1/256 turn) and converts to grey in fixed point. Outputs for
  the same parameters differ by a few grey levels.
- The crop is resized with bilinear interpolation on the half-pixel grid without antialiasing
  (``F.interpolate``, ``align_corners=False``); PIL's bilinear filter gives the same weights when
  enlarging, which is always the case here (a crop is never larger than the image), so only
  float rounding differs.
- When none of the 10 candidate crops fits, torchvision takes the fallback crop at the centre
  and kornia at a random position; for square images (all catalog datasets) the fallback is
  the whole image, so this never shows.
- The draws come from the same per-batch seed but through kornia's samplers, so a seed gives
  a different (equally distributed) augmentation than the ``pil`` backend: runs are
  reproducible within a backend, and switching backends changes a run's numbers. The
  parameters are drawn on the CPU for CUDA batches too, so a seed gives the same parameters
  on either device (pixels then differ by the devices' float rounding).

``cifar`` is the CIFAR training augmentation of MOON's code (Li et al., CVPR 2021, and
NIID-Bench before it): each image padded by 4 px with reflection, a random crop back to the
stored size, and a horizontal flip with probability 0.5.

Every random draw comes from the client's generator (the run's seeded RNG): a batch takes one
seed from it and the draws run under that seed on a forked CPU RNG, so the global RNG is
untouched and a run is reproducible, resumed runs included.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedshift.core.runconfig import AUGMENT_BACKENDS, AUGMENTS
from fedshift.data.domains import DatasetError

#: a batch augmentation: (uint8 images N x C x H x W, generator) -> augmented uint8 images
Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def batch_seed(rng: torch.Generator) -> int:
    """The one seed a batch takes from the client's generator; every draw of the batch's
    augmentation runs under it."""
    return int(torch.randint(0, 2**62, (1,), generator=rng))


class DomainBedAugment:
    """DomainBed's per-image training augmentation at ``image_size`` px, seeded per batch."""

    def __init__(self, image_size: int) -> None:
        from torchvision.transforms import v2

        self.image_size = int(image_size)
        self.transform = v2.Compose(
            [
                v2.RandomResizedCrop(self.image_size, scale=(0.7, 1.0), antialias=True),
                v2.RandomHorizontalFlip(),
                v2.ColorJitter(0.3, 0.3, 0.3, 0.3),
                v2.RandomGrayscale(0.1),
            ]
        )

    def __call__(self, images: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
        from torchvision.transforms.v2.functional import pil_to_tensor, to_pil_image

        seed = batch_seed(rng)
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(seed)
            return torch.stack(
                [pil_to_tensor(self.transform(to_pil_image(image))) for image in images]
            )


class BatchedDomainBedAugment:
    """DomainBed's training augmentation on whole uint8 batches on their own device (kornia),
    per-image parameters, seeded per batch (deviations from the PIL path: module docstring)."""

    def __init__(self, image_size: int) -> None:
        import kornia.augmentation as K

        self.image_size = int(image_size)
        size = (self.image_size, self.image_size)
        self.steps = (
            K.RandomResizedCrop(
                size,
                scale=(0.7, 1.0),
                ratio=(3.0 / 4.0, 4.0 / 3.0),
                resample="bilinear",
                align_corners=False,
                cropping_mode="slice",
            ),
            K.RandomHorizontalFlip(p=0.5),
            K.ColorJitter(0.3, 0.3, 0.3, 0.3, p=1.0),
            K.RandomGrayscale(p=0.1),
        )

    def draw(self, shape: torch.Size, seed: int) -> list[dict[str, torch.Tensor]]:
        """Every step's parameters for a batch of ``shape`` (N x C x H x W), drawn on the CPU
        under ``seed`` on a forked RNG (the global RNG is left as it was)."""
        params = []
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(seed)
            for step in self.steps:
                params.append(step.forward_parameters(shape))
                shape = torch.Size((*shape[:2], self.image_size, self.image_size))
        return params

    def apply(self, images: torch.Tensor, params: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """The steps with the drawn ``params`` on uint8 ``images``, on their device."""
        x = images.float().div_(255.0)
        for step, step_params in zip(self.steps, params, strict=True):
            x = step(x, params=step_params)
        return x.mul_(255.0).round_().clamp_(0.0, 255.0).to(torch.uint8)

    def __call__(self, images: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
        return self.apply(images, self.draw(images.shape, batch_seed(rng)))


class CifarAugment:
    """Reflect-pad by ``padding`` px, random crop to the stored size, random horizontal flip;
    offsets and flips are drawn from the client's generator."""

    def __init__(self, padding: int = 4) -> None:
        self.padding = int(padding)

    def __call__(self, images: torch.Tensor, rng: torch.Generator) -> torch.Tensor:
        n, _, height, width = images.shape
        pad = self.padding
        padded = torch.nn.functional.pad(images.float(), (pad, pad, pad, pad), mode="reflect")
        offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=rng).tolist()
        flips = (torch.rand(n, generator=rng) < 0.5).tolist()
        out = torch.empty_like(images)
        for i, ((top, left), flip) in enumerate(zip(offsets, flips, strict=True)):
            crop = padded[i, :, top : top + height, left : left + width]
            out[i] = (crop.flip(-1) if flip else crop).to(images.dtype)
        return out


def resolve_augment(name: str, dataset_default: str) -> str:
    """The augmentation a run uses: ``name``, or the dataset's default for ``auto``."""
    chosen = dataset_default if name == "auto" else name
    if chosen not in AUGMENTS[1:]:
        raise DatasetError(f"unknown augment {chosen!r}; choose one of: {', '.join(AUGMENTS)}")
    return chosen


def resolve_augment_backend(backend: str, device: torch.device) -> str:
    """Where ``augment=domainbed`` runs: ``backend``, or for ``auto`` ``batched`` on CUDA and
    ``pil`` on the CPU (faster there: ``docs/speed.md``)."""
    if backend not in AUGMENT_BACKENDS:
        raise DatasetError(
            f"unknown augment_backend {backend!r}; choose one of: {', '.join(AUGMENT_BACKENDS)}"
        )
    if backend == "auto":
        return "batched" if torch.device(device).type == "cuda" else "pil"
    return backend


def build_augment(name: str, image_size: int, channels: int, backend: str) -> Augment | None:
    """The batch augmentation ``name`` (already resolved) for images of that size, or None;
    ``backend`` (resolved: ``batched`` or ``pil``) picks DomainBed's implementation."""
    if name == "none":
        return None
    if channels != 3:
        raise DatasetError(
            f"augment={name} needs RGB images; this dataset has {channels} channel(s)"
        )
    if name == "cifar":
        augment = CifarAugment()
        if image_size <= augment.padding:
            raise DatasetError(
                f"augment=cifar pads by {augment.padding} px and needs images larger than "
                f"that; these are {image_size} px (use augment=none)"
            )
        return augment
    if backend == "batched":
        return BatchedDomainBedAugment(image_size)
    return DomainBedAugment(image_size)
