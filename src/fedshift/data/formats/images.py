"""Image files: the one set of suffixes fedshift reads as images, decoding a file into a
uint8 square, and the one resize of uint8 image tensors."""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedshift.core.bounded import open_regular
from fedshift.core.errors import DatasetError

if TYPE_CHECKING:  # torch loads only when data is read, not to list or describe it
    import torch


#: the suffixes (lower case) of the files every folder reader takes as images
IMAGE_SUFFIXES = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm"}
)
_DECODE_ERRORS = (OSError, ValueError, SyntaxError)
_VERIFY_BLOCK = 4096  # images whose headers are checked per batch of threads


def is_image_name(name: str) -> bool:
    """Whether a file name is a visible image file (hidden files such as ``._x.jpg`` are not)."""
    return not name.startswith(".") and Path(name).suffix.lower() in IMAGE_SUFFIXES


def image_files(folder: Path) -> list[Path]:
    """The image files of ``folder`` and its visible sub-folders, in sorted walk order."""
    found = []
    for dirpath, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(Path(dirpath) / f for f in sorted(files) if is_image_name(f))
    return found


def read_image(path: Path, size: int) -> np.ndarray:
    """An image file as a ``(3, size, size)`` uint8 array (RGB, bilinear at decode time, with
    JPEG's downscale-on-decode); an unreadable file raises DatasetError."""
    from PIL import Image, UnidentifiedImageError

    try:
        with open_regular(path, DatasetError, "image file") as handle, Image.open(handle) as im:
            im.draft("RGB", (size, size))  # fast JPEG downscale-on-decode; no-op otherwise
            rgb = im.convert("RGB")
            if rgb.size != (size, size):
                rgb = rgb.resize((size, size), Image.Resampling.BILINEAR)
            arr = np.asarray(rgb, dtype=np.uint8)
    except (*_DECODE_ERRORS, UnidentifiedImageError) as exc:
        raise DatasetError(f"unreadable image file {path}: {exc}") from None
    return arr.transpose(2, 0, 1)


def _header_failure(path: Path) -> str:
    """Why the header of image ``path`` does not open (PIL ``verify()``, no decoding), or ""."""
    from PIL import Image, UnidentifiedImageError

    try:
        with open_regular(path, DatasetError, "image file") as handle, Image.open(handle) as im:
            im.verify()
    except (*_DECODE_ERRORS, UnidentifiedImageError, DatasetError) as exc:
        return str(exc)
    return ""


def verify_images(paths: Sequence[Path]) -> None:
    """Open the header of each image once (a few threads: it is file access, not decoding);
    the first unreadable one in ``paths`` order raises DatasetError naming it."""
    workers = max(1, min(8, os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for start in range(0, len(paths), _VERIFY_BLOCK):  # bounded: DomainNet lists 586k
            block = paths[start : start + _VERIFY_BLOCK]
            for path, failure in zip(block, pool.map(_header_failure, block), strict=True):
                if failure:
                    raise DatasetError(f"unreadable image file {path}: {failure}")


def resize_uint8(pixels: torch.Tensor, size: int, chunk: int = 4096) -> torch.Tensor:
    """uint8 images ``N×C×H×W`` resized to ``size`` squares (bilinear, antialiased, rounded),
    ``chunk`` images at a time so no float copy of all of them is made."""
    import torch

    out = torch.empty((len(pixels), pixels.shape[1], size, size), dtype=torch.uint8)
    for start in range(0, len(pixels), chunk):
        block = pixels[start : start + chunk].float()
        resized = torch.nn.functional.interpolate(
            block, size=(size, size), mode="bilinear", align_corners=False, antialias=True
        )
        out[start : start + chunk] = resized.round().clamp(0, 255).to(torch.uint8)
    return out
