"""Peak resident memory of loading a catalog dataset: decoded into memory (the eager path),
the first load (decoding into the image cache) and a cached load (memory-mapped), each in
a fresh subprocess, on a generated Office-Caltech10-layout tree of JPEGs.

    python benchmarks/memory/catalog_cache_memory.py [--images 2000] [--size 224] [--work DIR]

Each figure is ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` of a subprocess that imports
fedshift, loads the dataset and exits; ``imports only`` is that process without the load.
``cached + one pass`` also reads every image once in batches of 64, as an epoch over all
data would: the file's pages it touched count as resident (shared with the page cache, which
the kernel may drop), they are not copies.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DOMAINS = ("amazon", "caltech", "dslr", "webcam")
CLASSES = 10


def make_tree(root: Path, images: int) -> None:
    """``images`` 300x225 JPEGs spread over the four domains and ten classes."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    ramp = np.linspace(0, 255, 300, dtype=np.float32)[None, :, None]
    for i in range(images):
        domain, label = DOMAINS[i % len(DOMAINS)], (i // len(DOMAINS)) % CLASSES
        folder = root / domain / f"class{label:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        noise = rng.integers(0, 64, (225, 300, 3)).astype(np.float32)
        pixels = np.clip(ramp * (label + 1) / CLASSES + noise, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:05d}.jpg", quality=90)


def measure(root: str, size: int, mode: str, cache_dir: str) -> dict:
    """Run in a subprocess: load (or not) and report the peak RSS in MiB and the seconds."""
    import resource

    from fedshift.data.catalog import load_catalog

    start = time.perf_counter()
    if mode != "imports":
        ds = load_catalog(
            "office-caltech10", root, image_size=size, cache_dir=cache_dir, cache=mode != "eager"
        )
        if mode == "pass":
            for domain in ds.domains.values():
                for begin in range(0, len(domain.test), 64):
                    domain.test.x[begin : begin + 64].float().sum()
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"mode": mode, "peak_rss_mib": round(peak, 1), "seconds": round(seconds, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--work", default="")
    parser.add_argument("--child", nargs=3, metavar=("ROOT", "MODE", "CACHE"))
    args = parser.parse_args()
    if args.child:
        root, mode, cache = args.child
        print(json.dumps(measure(root, args.size, mode, cache)))
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="fedshift-cache-rss-"))
    root, cache = work / "tree", work / "cache"
    if not root.exists():
        make_tree(root, args.images)
    labels = {
        "imports": "imports only",
        "eager": "decoded into memory (cache=False)",
        "first": "first load (decodes into the cache)",
        "cached": "cached load (memory-mapped)",
        "pass": "cached + one pass over every image",
    }
    decoded_mib = args.images * 3 * args.size * args.size / 2**20
    print(f"{args.images} JPEGs (300x225) at {args.size} px: {decoded_mib:.0f} MiB of pixels")
    for mode in labels:
        command = [sys.executable, __file__, "--size", str(args.size)]
        command += ["--child", str(root), mode, str(cache)]
        result = json.loads(subprocess.run(command, check=True, capture_output=True).stdout)
        print(
            f"{labels[mode]:40s} peak RSS {result['peak_rss_mib']:7.1f} MiB  "
            f"{result['seconds']:6.2f} s"
        )
    files = sorted((cache / "catalog").glob("*.npy"))
    print(f"cache: {len(files)} files, {sum(f.stat().st_size for f in files) / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
