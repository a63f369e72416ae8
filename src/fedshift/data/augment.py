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
- ``fused`` (:class:`FusedDomainBedAugment`): the same steps written as a few batched tensor
  ops on the batch's device, without kornia's per-module overhead: the crop and the flip are
  ONE affine grid per image (``F.affine_grid`` + ``F.grid_sample``, bilinear), the colour
  jitter about 25 elementwise kernels for the whole batch, the grayscale one ``where``. The
  parameters are torchvision's (crop drawn with RandomResizedCrop's rule, 10 tries then the
  centre fallback, integer boxes), drawn on the CPU from the batch's seed with a generator of
  their own (the global RNG is not touched), so a seed gives the same parameters on either
  device. Pixels are computed in float32 on the 0-255 scale and rounded to uint8 once.
  (``auto`` stays ``batched`` on CUDA until a GPU window has measured ``fused`` beside it:
  ``benchmarks/speed/data_pipeline.py --parts augment``.)

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

Deviation notes (``fused`` against torchvision's path for the same parameters; the ranges
are DomainBed's: scale 0.7-1, ratio 3/4-4/3, flip 0.5, jitter 0.3 each, grayscale 0.1):

- ColorJitter's order is drawn once per batch (one ``randperm(4)`` from the batch's seed), as
  the ``batched`` backend does, not once per image: each image's order is uniform over the
  24 permutations across batches, but the images of one batch share it.
- Float pixels rounded once at the end, as ``batched`` (PIL rounds after every step).
- The crop's bilinear resize samples the source on the half-pixel grid with the sampling
  points clamped to the crop's first and last pixel centres, which is what ``F.interpolate``
  (``align_corners=False``, no antialiasing) does on the cropped image; the crop is never
  larger than the image here (stored size in, stored size out), so antialiasing has nothing
  to do. Only float rounding differs (a grey level at most, tested).
- Hue is torchvision's HSV hue shift, computed with the closed HSV-to-RGB form (``v - v s
  clamp(min(k, 4 - k), 0, 1)``) instead of the six-sector table: the same values up to float
  rounding.
- The draws use their own generator seeded with the batch's seed, not torchvision's or
  kornia's samplers: runs are reproducible within the backend, and switching backends
  changes a run's numbers.

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


#: ITU-R 601-2 luma weights, as torchvision's ``rgb_to_grayscale``
_LUMA = (0.2989, 0.587, 0.114)


def _luma(x: torch.Tensor) -> torch.Tensor:
    """Grey levels (N x 1 x H x W) of RGB ``x`` (N x 3 x H x W), torchvision's weights."""
    return x[:, 0:1] * _LUMA[0] + x[:, 1:2] * _LUMA[1] + x[:, 2:3] * _LUMA[2]


def _per_image(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """An (N,) CPU tensor as N x 1 x 1 x 1 on ``like``'s device and dtype."""
    return values.to(device=like.device, dtype=like.dtype).view(-1, 1, 1, 1)


class FusedDomainBedAugment:
    """DomainBed's training augmentation as a few batched tensor ops on the batch's device:
    crop and flip as one affine grid, colour jitter and grayscale elementwise; per-image
    parameters drawn on the CPU from the batch's seed (deviations: module docstring).

    The keyword arguments are the ranges (DomainBed's by default); a range of 0 (or a
    probability of 0) skips that step, so ``scale=(1, 1), ratio=(1, 1), flip=0, brightness=0,
    contrast=0, saturation=0, hue=0, grayscale=0`` is the identity on square images."""

    def __init__(
        self,
        image_size: int,
        *,
        scale: tuple[float, float] = (0.7, 1.0),
        ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        flip: float = 0.5,
        brightness: float = 0.3,
        contrast: float = 0.3,
        saturation: float = 0.3,
        hue: float = 0.3,
        grayscale: float = 0.1,
    ) -> None:
        self.image_size = int(image_size)
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))
        self.flip = float(flip)
        self.brightness, self.contrast = float(brightness), float(contrast)
        self.saturation, self.hue = float(saturation), float(hue)
        self.grayscale = float(grayscale)

    # -- the draws (CPU) ------------------------------------------------------------------
    def _crops(self, n: int, height: int, width: int, gen: torch.Generator) -> torch.Tensor:
        """(left, top, width, height) per image, float64: torchvision's RandomResizedCrop
        rule (10 tries of area and log-uniform ratio, then the centre fallback)."""
        import math

        tries = 10
        area = height * width
        low, high = self.scale
        target = area * (
            low + (high - low) * torch.rand(n, tries, generator=gen, dtype=torch.float64)
        )
        log_low, log_high = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = torch.exp(
            log_low
            + (log_high - log_low) * torch.rand(n, tries, generator=gen, dtype=torch.float64)
        )
        w = torch.sqrt(target * aspect).round()
        h = torch.sqrt(target / aspect).round()
        fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
        first = fits.to(torch.int8).argmax(1, keepdim=True)  # the first try that fits
        w, h = w.gather(1, first).squeeze(1), h.gather(1, first).squeeze(1)
        position = torch.rand(n, 2, generator=gen, dtype=torch.float64)
        top = torch.floor(position[:, 0] * (height - h + 1))
        left = torch.floor(position[:, 1] * (width - w + 1))
        fallback = ~fits.any(1)
        if fallback.any():  # torchvision's fallback: the centre crop at the clamped ratio
            in_ratio = width / height
            if in_ratio < self.ratio[0]:
                fw, fh = width, round(width / self.ratio[0])
            elif in_ratio > self.ratio[1]:
                fw, fh = round(height * self.ratio[1]), height
            else:
                fw, fh = width, height
            w[fallback], h[fallback] = float(fw), float(fh)
            top[fallback], left[fallback] = float((height - fh) // 2), float((width - fw) // 2)
        return torch.stack([left, top, w, h], 1)

    def draw(self, shape: torch.Size, seed: int) -> dict[str, torch.Tensor]:
        """Every image's parameters for a batch of ``shape`` (N x C x H x W), on the CPU, from
        a generator seeded with ``seed``: ``crop`` (left, top, width, height), ``flip``,
        ``brightness``, ``contrast``, ``saturation``, ``hue``, ``grayscale`` and the batch's
        jitter ``order`` (0-3: brightness, contrast, saturation, hue)."""
        n, _, height, width = shape
        gen = torch.Generator().manual_seed(int(seed))

        def uniform(spread: float, centre: float) -> torch.Tensor:
            values = torch.rand(n, generator=gen, dtype=torch.float64)
            return centre - spread + 2 * spread * values

        return {
            "crop": self._crops(n, height, width, gen),
            "flip": torch.rand(n, generator=gen) < self.flip,
            "brightness": uniform(self.brightness, 1.0),
            "contrast": uniform(self.contrast, 1.0),
            "saturation": uniform(self.saturation, 1.0),
            "hue": uniform(self.hue, 0.0),
            "order": torch.randperm(4, generator=gen),
            "grayscale": torch.rand(n, generator=gen) < self.grayscale,
        }

    # -- the pixels (the batch's device) ---------------------------------------------------
    def _geometry(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """Crop, resize to ``image_size`` and flip: one affine grid, one bilinear sample."""
        import torch.nn.functional as F

        n, channels, height, width = images.shape
        left, top, w, h = params["crop"].unbind(1)
        sign = 1.0 - 2.0 * params["flip"].to(torch.float64)
        theta = torch.zeros(n, 2, 3, dtype=torch.float64)
        theta[:, 0, 0] = sign * w / width
        theta[:, 0, 2] = (2 * left + w) / width - 1
        theta[:, 1, 1] = h / height
        theta[:, 1, 2] = (2 * top + h) / height - 1
        # the sampling points stay inside the crop's first and last pixel centres, as
        # F.interpolate's do on the cropped image (normalized: pixel p at (2p + 1) / size - 1)
        low = torch.stack([(2 * left + 1) / width - 1, (2 * top + 1) / height - 1], 1)
        high = torch.stack([(2 * (left + w) - 1) / width - 1, (2 * (top + h) - 1) / height - 1], 1)
        device = images.device
        theta = theta.to(device=device, dtype=torch.float32)
        low = low.to(device=device, dtype=torch.float32).view(n, 1, 1, 2)
        high = high.to(device=device, dtype=torch.float32).view(n, 1, 1, 2)
        size = (n, channels, self.image_size, self.image_size)
        grid = F.affine_grid(theta, size, align_corners=False)
        grid = torch.clamp(grid, low, high)
        return F.grid_sample(
            images.float(), grid, mode="bilinear", padding_mode="border", align_corners=False
        )

    @staticmethod
    def _hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        """torchvision's HSV hue shift (``adjust_hue``) by ``shift`` turns per image."""
        top, argmax = x.max(1)  # the first maximal channel, as torchvision's ties go
        delta = top - x.amin(1)
        r, g, b = x.unbind(1)
        safe = torch.where(delta > 0, delta, torch.ones_like(delta))
        sector = torch.where(
            argmax == 0,
            (g - b) / safe,
            torch.where(argmax == 1, (b - r) / safe + 2.0, (r - g) / safe + 4.0),
        )
        sector = sector + 6.0 * shift.view(-1, 1, 1)
        offsets = torch.tensor([5.0, 3.0, 1.0], device=x.device, dtype=x.dtype).view(1, 3, 1, 1)
        k = torch.remainder(sector.unsqueeze(1) + offsets, 6.0)
        weight = torch.minimum(k, 4.0 - k).clamp_(0.0, 1.0)
        return top.unsqueeze(1) - delta.unsqueeze(1) * weight

    def apply(self, images: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
        """The augmentation with the drawn ``params`` on uint8 ``images``, on their device."""
        x = self._geometry(images, params)  # float32, 0-255
        for step in params["order"].tolist():
            if step == 0 and self.brightness:
                x = x.mul_(_per_image(params["brightness"], x)).clamp_(0.0, 255.0)
            elif step == 1 and self.contrast:
                mean = _luma(x).mean(dim=(1, 2, 3), keepdim=True)
                x = x.sub_(mean).mul_(_per_image(params["contrast"], x)).add_(mean)
                x = x.clamp_(0.0, 255.0)
            elif step == 2 and self.saturation:
                grey = _luma(x)
                x = x.sub_(grey).mul_(_per_image(params["saturation"], x)).add_(grey)
                x = x.clamp_(0.0, 255.0)
            elif step == 3 and self.hue:
                x = self._hue(x, params["hue"].to(device=x.device, dtype=x.dtype))
        if bool(params["grayscale"].any()):
            mask = params["grayscale"].to(x.device).view(-1, 1, 1, 1)
            x = torch.where(mask, _luma(x).expand_as(x), x)
        return x.round_().clamp_(0.0, 255.0).to(torch.uint8)

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
    ``backend`` (resolved: ``batched``, ``fused`` or ``pil``) picks DomainBed's implementation."""
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
    if backend == "fused":
        return FusedDomainBedAugment(image_size)
    return DomainBedAugment(image_size)
