"""Training-time augmentation of image batches (the ``augment`` run key).

``domainbed`` is DomainBed's training augmentation for its photo datasets (Gulrajani and
Lopez-Paz, ICLR 2021): RandomResizedCrop to the stored size with scale (0.7, 1.0), a
horizontal flip, ColorJitter(0.3, 0.3, 0.3, 0.3) and RandomGrayscale(0.1), drawn per image
with ``torchvision.transforms.v2``. The transforms run on PIL images, as in DomainBed (each
cached uint8 row is wrapped as one, then turned back into a tensor): PIL's colour kernels are
about twice as fast as torchvision's tensor ones (hue: 3.2 vs 6.4 ms per 224 px image). The
crop is taken from the decoded image (224 px for the catalog datasets), not from the
original file.

``cifar`` is the CIFAR training augmentation of MOON's code (Li et al., CVPR 2021, and
NIID-Bench before it): each image padded by 4 px with reflection, a random crop back to the
stored size, and a horizontal flip with probability 0.5.

Every random draw comes from the client's generator (the run's seeded RNG): a batch takes one
seed from it and the transforms run under that seed on a forked CPU RNG, so the global RNG is
untouched and a run is reproducible, resumed runs included.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedshift.core.runconfig import AUGMENTS
from fedshift.data.domains import DatasetError

#: a batch augmentation: (uint8 images N x C x H x W, generator) -> augmented uint8 images
Augment = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


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

        seed = int(torch.randint(0, 2**62, (1,), generator=rng))
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(seed)
            return torch.stack(
                [pil_to_tensor(self.transform(to_pil_image(image))) for image in images]
            )


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


def build_augment(name: str, image_size: int, channels: int) -> Augment | None:
    """The batch augmentation ``name`` (already resolved) for images of that size, or None."""
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
    return DomainBedAugment(image_size)
