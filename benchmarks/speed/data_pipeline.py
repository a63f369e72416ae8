"""fedshift's input pipeline against torchvision's ``ImageFolder`` + ``DataLoader``, ResNet-18
training speed at 224 px, and the peak memory of a run's data on PACS- and DomainNet-sized
data.

    python benchmarks/speed/data_pipeline.py [--images 2000] [--repeats 3] [--threads 1]
                                       [--workers 0] [--batch 64] [--size 224]
                                       [--parts pipeline,resnet,rss,augment] [--work DIR]
                                       [--augment-batches 8] [--compile BACKEND] [--smoke]

``--parts`` picks the sections (default: ``pipeline``).

**Pipeline** (``pipeline``): a generated PACS-layout tree (``kfold/<domain>/<class>/*.jpg`` and
the kfold lists; ``--images`` JPEGs of 227x227, seeded, spread over the four domains in the
official proportions). Both sides read every image of every domain once per pass, shuffled,
in batches of ``--batch``, and end with normalized float32 batches of ``--size`` px:

    fedshift     the catalog loader's memory-mapped uint8 cache (decoded once, beforehand;
                 that time is printed apart), each domain's images as a client's share (a
                 lazy view), DomainBed's augmentation on uint8 tensors (``augment=domainbed``)
                 and the [-1, 1] scaling, i.e. ``SplitView.batches`` of a run
    ImageFolder  ``torchvision.datasets.ImageFolder`` per domain + ``DataLoader``: PIL decode,
                 ``Resize`` to the size, DomainBed's transform (RandomResizedCrop scale
                 0.7-1, flip, ColorJitter 0.3 x 4, RandomGrayscale 0.1), ``ToTensor`` and
                 ``Normalize``, with ``--workers`` worker processes (0: in the main process)

The same two without the augmentation (``no augmentation`` rows: the cached uint8 rows and
the scaling against decode, resize, ``ToTensor`` and ``Normalize``) isolate the data path
from the augmentation kernels. Each repetition times one pass of all four in turn
(interleaved, after a warm-up batch each); the table has min and median images/s and the
ratios of the medians.

**ResNet-18** (``resnet``): training samples/s (SGD, cross-entropy, batch 16 on the CPU)
at 224 px on random inputs; on a CUDA device also bf16 autocast + channels_last (batch 128)
and the share of the device's dense bf16 peak (``--peak-tflops``, or a table of known
devices), counting 3 x 1.82 GMAC x 2 FLOP per training sample. ``--compile BACKEND`` adds a
line for the last of those settings: samples/s with the model compiled in place as the run
key ``compile=true`` does (``nn.Module.compile``; ``inductor`` is its backend) against
eager, and the seconds of the first, compiling step.

**Augmentation backends** (``augment``): DomainBed's augmentation (``augment=domainbed``) of
``--augment-batches`` uint8 batches of ``--batch`` images at ``--size`` px on the CPU with
each backend (``augment_backend``: ``pil``, image by image on PIL; ``batched``, kornia on the
whole batch; ``fused``, a few batched tensor ops: one affine grid for crop and flip, the
jitter and grayscale elementwise), repetitions interleaved, min and median images/s. On a
CUDA device (and on the CPU at tiny sizes with ``--smoke``, so that a prepared GPU command is
tested) also the ``batched`` (kornia) and ``fused`` backends on the device, each host batch
copied there first as a run does (batch 128 on CUDA), against ResNet-18's training samples/s
at the same size and batch (bf16 autocast + channels_last on CUDA), interleaved, side by
side, with each backend's augmentation/training ratio (issue 44's target: >= 3x, the input
pipeline outruns the model) and fused/kornia.

**Memory** (``rss``): in fresh subprocesses, ``VmHWM`` (peak resident set) and the
anonymous resident memory at the end (``RssAnon``: the process's own copies, not the page
cache's file pages) of (1) importing fedshift only, (2) a PACS run's setup on the generated
tree (cached catalog load, leave-one-domain-out clients, ``--clients`` per domain) and one
pass over every client's training batches with augmentation, and (3) the same on a
DomainNet-sized dataset: six domains with DomainNet's official image counts (586,575 images,
the official train/test sizes, val a 0.2 holdout of train) at ``--size`` px, whose cache
files are sparse ``.npy`` files of the real size (82 GiB at 224 px; they take no disk space
and read as zeros), memory-mapped read-only with every split a RowGather, as the image
cache's files are; every client
reads ``--rss-batches`` augmented batches. The figure the old eager shares would have
copied (every client's train, val and test pixels) is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

PACS_DOMAINS = ("art_painting", "cartoon", "photo", "sketch")
PACS_CLASSES = ("dog", "elephant", "giraffe", "guitar", "horse", "house", "person")
PACS_TOTALS = {"art_painting": 2048, "cartoon": 2344, "photo": 1670, "sketch": 3929}
#: DomainNet's official list sizes per domain: (train, test)
DOMAINNET_COUNTS = {
    "clipart": (33525, 14604),
    "infograph": (36023, 15582),
    "painting": (50416, 21850),
    "quickdraw": (120750, 51750),
    "real": (120906, 52041),
    "sketch": (48212, 20916),
}
DOMAINNET_CLASSES = 345
#: multiply-accumulates of one ResNet-18 forward pass at 224 px
RESNET18_MACS = 1.82e9
#: dense bf16 peak (FLOP/s) of known devices, matched against the CUDA device name
BF16_PEAK = {"H200": 989e12, "H100 PCIe": 756e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12}
SIDE = 227


# -- the generated tree -------------------------------------------------------------------
def make_pacs_tree(root: Path, images: int, seed: int = 0) -> None:
    """``images`` 227x227 JPEGs (smooth colour fields, shapes and grain, quality 90, about the
    size of PACS's files) in the kfold layout, with 90/10 train/crossval lists and test lists
    holding every image of a domain."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng(seed)
    total = sum(PACS_TOTALS.values())
    counts = {d: max(len(PACS_CLASSES), images * n // total) for d, n in PACS_TOTALS.items()}
    yy, xx = np.mgrid[0:SIDE, 0:SIDE].astype(np.float32) / SIDE
    for domain, count in counts.items():
        rows = []
        for i in range(count):
            label = i % len(PACS_CLASSES)
            relative = f"{domain}/{PACS_CLASSES[label]}/pic_{i:05d}.jpg"
            path = root / "kfold" / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            a, b, c = rng.uniform(0, 255, 3), rng.uniform(-160, 160, 3), rng.uniform(-160, 160, 3)
            field = a + b * xx[..., None] + c * yy[..., None]
            grain = rng.normal(0, 12, (SIDE, SIDE, 3))
            picture = Image.fromarray(np.clip(field + grain, 0, 255).astype(np.uint8))
            draw = ImageDraw.Draw(picture)
            for _ in range(6):
                x0, y0 = rng.integers(0, SIDE - 20, 2)
                x1, y1 = x0 + rng.integers(10, 120), y0 + rng.integers(10, 120)
                colour = tuple(int(v) for v in rng.integers(0, 256, 3))
                draw.ellipse((int(x0), int(y0), int(x1), int(y1)), fill=colour)
            picture.save(path, quality=90)
            rows.append(f"{relative} {label + 1}")
        cut = len(rows) - max(1, len(rows) // 10)
        lists = {"train": rows[:cut], "crossval": rows[cut:], "test": rows}
        for split, lines in lists.items():
            (root / f"{domain}_{split}_kfold.txt").write_text("\n".join(lines) + "\n")


def tree(work: Path, images: int) -> Path:
    """The generated tree under ``work`` (made once per image count)."""
    root = work / f"pacs-{images}"
    if not (root / "sketch_test_kfold.txt").exists():
        print(f"generating {images} JPEGs under {root}", flush=True)
        make_pacs_tree(root, images)
    return root


# -- the two pipelines ----------------------------------------------------------------------
def fedshift_pipeline(root: Path, cache: Path, size: int, batch: int, augmented: bool = True):
    """A pass factory over every domain's images as lazy client shares, with the run's
    DomainBed augmentation; returns (pass, images per pass, seconds of the first decode)."""
    import torch

    from fedshift.core.context import SplitView
    from fedshift.data.augment import DomainBedAugment
    from fedshift.data.catalog import load_catalog

    start = time.perf_counter()
    ds = load_catalog("pacs", root, image_size=size, cache_dir=str(cache))
    load_seconds = time.perf_counter() - start
    augment = DomainBedAugment(size) if augmented else None
    cpu = torch.device("cpu")
    views = []
    for number, domain in enumerate(ds.domains.values()):
        order = torch.randperm(len(domain.test), generator=torch.Generator().manual_seed(number))
        views.append(SplitView(domain.test.subset(order), True, cpu, augment))
    generator = torch.Generator().manual_seed(0)

    def one_pass(limit: int | None = None) -> int:
        seen = 0
        for view in views:
            for x, _ in view.batches(batch, generator):
                seen += len(x)
                if limit is not None and seen >= limit:
                    return seen
        return seen

    return one_pass, sum(len(v) for v in views), load_seconds


def imagefolder_pipeline(root: Path, size: int, batch: int, workers: int, augmented: bool = True):
    """The same pass with torchvision's ImageFolder + DataLoader (decode and transform on
    the fly)."""
    import torch
    from torch.utils.data import ConcatDataset, DataLoader
    from torchvision import datasets
    from torchvision import transforms as T

    domainbed = [
        T.RandomResizedCrop(size, scale=(0.7, 1.0)),
        T.RandomHorizontalFlip(),
        T.ColorJitter(0.3, 0.3, 0.3, 0.3),
        T.RandomGrayscale(0.1),
    ]
    transform = T.Compose(
        [
            T.Resize((size, size)),
            *(domainbed if augmented else []),
            T.ToTensor(),
            T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )
    parts = [datasets.ImageFolder(root / "kfold" / d, transform=transform) for d in PACS_DOMAINS]
    data = ConcatDataset(parts)
    loader = DataLoader(
        data,
        batch_size=batch,
        shuffle=True,
        num_workers=workers,
        generator=torch.Generator().manual_seed(0),
        persistent_workers=workers > 0,
    )

    def one_pass(limit: int | None = None) -> int:
        seen = 0
        for x, _ in loader:
            seen += len(x)
            if limit is not None and seen >= limit:
                return seen
        return seen

    return one_pass, len(data)


def pipeline_table(args, work: Path) -> list[str]:
    root = tree(work, args.images)
    fed_pass, fed_images, load_seconds = fedshift_pipeline(
        root, work / "cache", args.size, args.batch
    )
    folder_pass, folder_images = imagefolder_pipeline(root, args.size, args.batch, args.workers)
    assert fed_images == folder_images, (fed_images, folder_images)
    passes = {"fedshift": fed_pass, "ImageFolder": folder_pass}
    plain = fedshift_pipeline(root, work / "cache", args.size, args.batch, augmented=False)[0]
    passes["fedshift, no augmentation"] = plain
    plain = imagefolder_pipeline(root, args.size, args.batch, args.workers, augmented=False)[0]
    passes["ImageFolder, no augmentation"] = plain
    lines = [
        f"{fed_images} images (227x227 JPEG) -> {args.size} px, batch {args.batch}, "
        f"{args.threads} torch thread(s), ImageFolder workers {args.workers}; "
        f"fedshift's cache load {load_seconds:.1f} s (decodes only on the first run)",
        "",
        "| pipeline | images/s min | images/s median |",
        "|---|---|---|",
    ]
    rates: dict[str, list[float]] = {name: [] for name in passes}
    for one_pass in passes.values():
        one_pass(limit=args.batch)  # warm-up: first pages, worker start, lazy imports
    for _ in range(args.repeats):
        for name, one_pass in passes.items():
            start = time.perf_counter()
            seen = one_pass()
            rates[name].append(seen / (time.perf_counter() - start))
    for name, values in rates.items():
        lines.append(f"| {name} | {min(values):,.0f} | {statistics.median(values):,.0f} |")
    median = {name: statistics.median(values) for name, values in rates.items()}
    ratio = median["fedshift"] / median["ImageFolder"]
    plain = median["fedshift, no augmentation"] / median["ImageFolder, no augmentation"]
    lines += [
        "",
        f"fedshift/ImageFolder (median images/s): {ratio:.2f}x; "
        f"without augmentation (the data path alone): {plain:.2f}x",
    ]
    return lines


# -- ResNet-18 --------------------------------------------------------------------------------
def timed_steps(model, x, y, fast: bool, steps: int) -> float:
    """Seconds of ``steps`` SGD steps after one warm-up step (bf16 autocast when ``fast``)."""
    import torch
    import torch.nn.functional as F

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    device = x.device.type

    def step() -> None:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=fast):
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    step()
    if fast:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if fast:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def resnet_lines(args) -> list[str]:
    import torch
    from torchvision.models import resnet18

    flop_per_sample = 3 * 2 * RESNET18_MACS
    settings = [("cpu", "float32", 4 if args.smoke else 16, 1 if args.smoke else 3)]
    if torch.cuda.is_available():
        settings.append(("cuda", "bf16 autocast + channels_last", 128, 20))
    lines = [
        "| device | precision | batch | samples/s | share of bf16 peak |",
        "|---|---|---|---|---|",
    ]
    size = 64 if args.smoke else 224
    for device, precision, batch, steps in settings:
        model = resnet18(num_classes=len(PACS_CLASSES)).to(device)
        x = torch.randn(batch, 3, size, size, device=device)
        y = torch.randint(0, len(PACS_CLASSES), (batch,), device=device)
        fast = device == "cuda"
        if fast:
            model = model.to(memory_format=torch.channels_last)
            x = x.to(memory_format=torch.channels_last)
        seconds = timed_steps(model, x, y, fast, steps)
        rate = batch * steps / seconds
        share = "-"
        if fast:
            name = torch.cuda.get_device_name()
            peak = args.peak_tflops * 1e12 if args.peak_tflops else None
            peak = peak or next((v for k, v in BF16_PEAK.items() if k in name), None)
            share = "? (give --peak-tflops)"
            if peak:
                share = f"{rate * flop_per_sample / peak:.1%} of {peak / 1e12:.0f} TFLOP/s"
            device = name
        lines.append(f"| {device} | {precision} | {batch} | {rate:,.1f} | {share} |")
    if args.compile:
        lines.append(compile_line(args, model, x, y, fast, steps, rate))
    if size != 224:
        lines.append(f"(smoke mode: {size} px)")
    return lines


def compile_line(args, eager, x, y, fast: bool, steps: int, eager_rate: float) -> str:
    """The last setting's samples/s with the model compiled in place as ``compile=true``
    compiles it (``nn.Module.compile``, default mode; backend ``--compile``) against eager,
    and the seconds of the first (compiling) step."""
    import copy

    model = copy.deepcopy(eager)
    model.compile(backend=args.compile)
    start = time.perf_counter()
    seconds = timed_steps(model, x, y, fast, steps)
    first = time.perf_counter() - start - seconds
    rate = x.shape[0] * steps / seconds
    where = "bf16 autocast + channels_last" if fast else "float32"
    return (
        f"compile=true vs false ({args.compile}, {where}, batch {x.shape[0]}): "
        f"{rate:,.1f} vs {eager_rate:,.1f} samples/s ({rate / eager_rate:.2f}x); "
        f"first step {first:.0f} s (compiling)"
    )


# -- augmentation backends ---------------------------------------------------------------------
def photo_batch(count: int, size: int, seed: int = 0):
    """``count`` uint8 RGB images of ``size`` px: colour ramps and grain, like photos for the
    colour kernels (their cost does not depend on content)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ramp = torch.linspace(0, 1, size)
    base = torch.rand(count, 3, 1, 1, generator=gen) * 0.5 + 0.25 * (ramp[None] + ramp[:, None])
    grain = torch.rand(count, 3, size, size, generator=gen) * 0.2
    return ((base + grain).clamp(0, 1) * 255).round().to(torch.uint8)


def augment_lines(args) -> list[str]:
    """The three backends on the CPU, and the batched ones on the device against ResNet-18."""
    import torch

    from fedshift.data.augment import (
        BatchedDomainBedAugment,
        DomainBedAugment,
        FusedDomainBedAugment,
    )

    images = photo_batch(args.batch, args.size)
    backends = {
        "pil": DomainBedAugment(args.size),
        "batched": BatchedDomainBedAugment(args.size),
        "fused": FusedDomainBedAugment(args.size),
    }
    generator = torch.Generator().manual_seed(0)
    for augment in backends.values():
        augment(images, generator)  # warm-up: lazy imports, first allocations
    rates: dict[str, list[float]] = {name: [] for name in backends}
    for _ in range(args.repeats):
        for name, augment in backends.items():
            start = time.perf_counter()
            for _ in range(args.augment_batches):
                augment(images, generator)
            rates[name].append(args.augment_batches * len(images) / (time.perf_counter() - start))
    lines = [
        f"DomainBed augmentation, {args.augment_batches} batches of {args.batch} uint8 images "
        f"at {args.size} px per repetition, {args.threads} torch thread(s)",
        "",
        "| augment_backend | device | images/s min | images/s median |",
        "|---|---|---|---|",
    ]
    for name, values in rates.items():
        lines.append(f"| {name} | cpu | {min(values):,.0f} | {statistics.median(values):,.0f} |")
    median = {name: statistics.median(values) for name, values in rates.items()}
    ratio = median["batched"] / median["pil"]
    lines += ["", f"batched/pil on the CPU (median images/s): {ratio:.2f}x"]
    fused = median["fused"] / median["pil"]
    lines.append(
        f"fused/pil on the CPU (median images/s): {fused:.2f}x; "
        f"fused/batched: {median['fused'] / median['batched']:.2f}x"
    )
    if torch.cuda.is_available():
        lines += ["", *device_augment_lines(args, torch.device("cuda"), batch=128, steps=20)]
    elif args.smoke:
        lines += ["", *device_augment_lines(args, torch.device("cpu"), args.batch, steps=1)]
    else:
        lines += ["", "no CUDA device: the batched backends against GPU training are not measured"]
    return lines


def device_augment_lines(args, device, batch: int, steps: int) -> list[str]:
    """The kornia (``batched``) and ``fused`` augmentations (host batch -> device -> augment)
    and ResNet-18 training on ``device``, samples/s, median of ``--repeats`` interleaved
    repetitions of ``steps`` batches each."""
    import torch
    from torchvision.models import resnet18

    from fedshift.data.augment import BatchedDomainBedAugment, FusedDomainBedAugment

    fast = device.type == "cuda"
    augments = {
        "batched": BatchedDomainBedAugment(args.size),
        "fused": FusedDomainBedAugment(args.size),
    }
    host = photo_batch(batch, args.size, seed=1)
    generator = torch.Generator().manual_seed(0)
    model = resnet18(num_classes=len(PACS_CLASSES)).to(device)
    x = torch.randn(batch, 3, args.size, args.size, device=device)
    y = torch.randint(0, len(PACS_CLASSES), (batch,), device=device)
    if fast:
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)

    def augment_seconds(augment) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            augment(host.to(device, non_blocking=True), generator)
        if fast:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    for augment in augments.values():
        augment_seconds(augment)  # warm-up: lazy imports, first allocations, kernel caches
    augmented: dict[str, list[float]] = {name: [] for name in augments}
    trained = []
    for _ in range(args.repeats):
        for name, augment in augments.items():
            augmented[name].append(batch * steps / augment_seconds(augment))
        trained.append(batch * steps / timed_steps(model, x, y, fast, steps))
    name = torch.cuda.get_device_name(device) if fast else "cpu"
    precision = "bf16 autocast + channels_last" if fast else "float32"
    rate = {key: statistics.median(values) for key, values in augmented.items()}
    train_rate = statistics.median(trained)
    return [
        f"on {name}, batch {batch}, {args.size} px, median of {args.repeats} x {steps} batches, "
        "interleaved",
        "",
        "| work | samples/s median | /training |",
        "|---|---|---|",
        f"| batched augmentation, kornia (host uint8 batch -> {device.type} -> augmented) "
        f"| {rate['batched']:,.0f} | {rate['batched'] / train_rate:.2f}x |",
        f"| fused augmentation (host uint8 batch -> {device.type} -> augmented) "
        f"| {rate['fused']:,.0f} | {rate['fused'] / train_rate:.2f}x |",
        f"| ResNet-18 training ({precision}) | {train_rate:,.0f} | 1.00x |",
        "",
        f"augmentation/training (samples/s): fused {rate['fused'] / train_rate:.2f}x, "
        f"kornia {rate['batched'] / train_rate:.2f}x (target >= 3x); "
        f"fused/kornia {rate['fused'] / rate['batched']:.2f}x",
    ]


# -- memory -----------------------------------------------------------------------------------
def _rss_anon_mib() -> float:
    status = Path("/proc/self/status")
    if not status.exists():
        return float("nan")
    for line in status.read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _peak_mib() -> float:
    """The process's peak resident set: ``VmHWM`` on Linux (``ru_maxrss`` there would carry
    the parent's peak over ``fork`` + ``exec``), else ``ru_maxrss``."""
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def domainnet_dataset(folder: Path, size: int, scale: float):
    """A DomainNet-sized DomainDataset over sparse memory-mapped uint8 files (zeros)."""
    import torch

    from fedshift.core.split import Split
    from fedshift.data.domains import Domain, DomainDataset

    folder.mkdir(parents=True, exist_ok=True)
    domains = {}
    for name, (train_count, test_count) in DOMAINNET_COUNTS.items():
        train_count, test_count = max(4, int(train_count * scale)), max(2, int(test_count * scale))
        rows = train_count + test_count
        path = folder / f"domainnet-{name}-{size}px-{rows}.npy"
        if not path.exists():  # a header and a hole: numpy seeks to the end and writes 1 byte
            np.lib.format.open_memmap(path, "w+", np.uint8, (rows, 3, size, size)).flush()
        with warnings.catch_warnings():  # read-only, as the image cache maps its files
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            pixels = torch.from_numpy(np.load(path, mmap_mode="r"))
        whole = Split(x=pixels, y=torch.arange(rows) % DOMAINNET_CLASSES)
        cut = train_count - train_count // 5
        domains[name] = Domain(
            name=name,
            train=whole.subset(torch.arange(cut)),
            val=whole.subset(torch.arange(cut, train_count)),
            test=whole.subset(torch.arange(train_count, rows)),
        )
    meta = {"augment": "domainbed", "normalization": "imagenet"}
    return DomainDataset(
        "domainnet", domains, [f"c{k}" for k in range(DOMAINNET_CLASSES)], 3, size, meta
    )


def measure_child(kind: str, args) -> dict:
    """Run in a subprocess: one memory figure (see the module docstring)."""
    import torch

    torch.set_num_threads(args.threads)
    from fedshift.config import resolve
    from fedshift.engine.assembly import prepare

    start = time.perf_counter()
    result = {"kind": kind}
    if kind == "imports":
        return {**result, "peak_mib": _peak_mib(), "anon_mib": _rss_anon_mib(), "seconds": 0.0}
    common = [f"image_size={args.size}", f"clients_per_domain={args.clients}", "threads=1"]
    common += ["model=resnet18", "rounds=1"]
    if kind == "pacs":
        root = tree(Path(args.work), args.images)
        sets = ["dataset=pacs", f"data_root={root}", "target=sketch", *common]
        exp = prepare(resolve(None, {}, sets), cache_dir=str(Path(args.work) / "cache"))
        batches = None
    else:
        ds = domainnet_dataset(Path(args.work) / "sparse", args.size, args.domainnet_scale)
        exp = prepare(
            resolve(None, {}, ["dataset=domainnet", "target=sketch", *common]), dataset=ds
        )
        batches = args.rss_batches
    domains = exp.dataset.domains.values()
    if kind == "pacs":  # its test split is the whole domain
        images = sum(len(d.test) for d in domains)
    else:
        images = sum(len(d.test) + len(d.train) + len(d.val) for d in domains)
    built = {"anon_after_setup_mib": _rss_anon_mib()}
    seen = 0
    for ctx in exp.contexts.values():
        for number, (x, _) in enumerate(ctx.train.batches(args.batch, ctx.rng)):
            seen += len(x)
            if batches is not None and number + 1 >= batches:
                break
    eager = 0
    for shard in exp.scenario.clients:
        for split in (shard.train, shard.val, shard.test):
            eager += len(split) * int(np.prod(split.x.shape[1:]))
    return {
        **result,
        **built,
        "images": images,
        "clients": len(exp.contexts),
        "batches_read": seen,
        "peak_mib": _peak_mib(),
        "anon_mib": _rss_anon_mib(),
        "eager_shares_mib": eager / 2**20,
        "seconds": time.perf_counter() - start,
    }


def rss_lines(args, work: Path) -> list[str]:
    lines = [
        "| data | images | clients | images read | peak RSS MiB | RssAnon MiB at end | "
        "eager shares would copy MiB | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    if "pacs" in args.rss_kinds:
        tree(work, args.images)  # generated here, not inside the measured process
    for kind in args.rss_kinds:
        command = [sys.executable, __file__, "--child", kind, "--work", str(work)]
        command += ["--size", str(args.size), "--images", str(args.images)]
        command += ["--clients", str(args.clients), "--batch", str(args.batch)]
        command += ["--rss-batches", str(args.rss_batches), "--threads", str(args.threads)]
        command += ["--domainnet-scale", str(args.domainnet_scale)]
        done = subprocess.run(command, check=True, capture_output=True, text=True)
        r = json.loads(done.stdout.strip().splitlines()[-1])
        label = {
            "imports": "imports only",
            "pacs": "PACS-layout tree",
            "domainnet": "DomainNet-sized",
        }[kind]
        lines.append(
            f"| {label} | {r.get('images', 0):,} | {r.get('clients', 0)} | "
            f"{r.get('batches_read', 0):,} | {r['peak_mib']:,.0f} | {r['anon_mib']:,.0f} | "
            f"{r.get('eager_shares_mib', 0):,.0f} | {r['seconds']:.1f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000, help="JPEGs in the generated tree")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (both sides)")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--parts", default="pipeline", help="of pipeline,resnet,rss,augment")
    parser.add_argument("--augment-batches", type=int, default=8, help="per repetition")
    parser.add_argument("--peak-tflops", type=float, default=0.0, help="device bf16 peak")
    parser.add_argument("--rss-kinds", default="imports,pacs,domainnet")
    parser.add_argument("--clients", type=int, default=4, help="clients per source domain")
    parser.add_argument("--rss-batches", type=int, default=2, help="DomainNet batches a client")
    parser.add_argument("--domainnet-scale", type=float, default=1.0, help="of DomainNet's counts")
    parser.add_argument("--work", default="", help="folder for the tree and caches (kept)")
    parser.add_argument("--smoke", action="store_true", help="tiny settings: a test that it runs")
    parser.add_argument(
        "--compile",
        default="",
        metavar="BACKEND",
        help="resnet: also time the model compiled in place with this torch.compile backend "
        "(inductor: compile=true's; eager: a quick check that the step runs)",
    )
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.rss_kinds = [k for k in args.rss_kinds.split(",") if k]
    if args.child:
        print(json.dumps(measure_child(args.child, args)))
        return []
    if args.smoke:
        args.images, args.repeats, args.batch, args.size = 60, 1, 8, 32
        args.clients, args.rss_batches, args.domainnet_scale = 1, 1, 0.001
        args.augment_batches = 1
    import torch

    torch.set_num_threads(args.threads)
    work = Path(args.work or tempfile.mkdtemp(prefix="fedshift-pipeline-"))
    parts = {p for p in args.parts.split(",") if p}
    unknown = parts - {"pipeline", "resnet", "rss", "augment"}
    if unknown:
        parser.error(
            f"unknown part {sorted(unknown)[0]!r}; choose from pipeline, resnet, rss, augment"
        )
    lines = []
    sections = [
        ("pipeline", lambda: pipeline_table(args, work)),
        ("resnet", lambda: ["", *resnet_lines(args)]),
        ("rss", lambda: ["", *rss_lines(args, work)]),
        ("augment", lambda: ["", *augment_lines(args)]),
    ]
    for name, section in sections:
        if name in parts:  # each printed when done: a time-boxed caller keeps what finished
            done = section()
            print("\n".join(done), flush=True)
            lines += done
    return lines


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
