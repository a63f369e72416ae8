"""Time and peak memory of `fedshift datasets check digit-five` and of loading Digit-Five,
on a generated full-size tree (the official file sizes) of random pixels in the public
copies' formats.

    python benchmarks/speed/digit_five_load.py [--work DIR]

Each figure comes from a fresh subprocess: wall seconds, CPU seconds (user + system, the
steadier figure on a shared machine) and ``ru_maxrss`` (peak RSS). ``imports only`` is a
process that imports fedshift and torch and exits; ``first load`` decodes MNIST-M's sampled
PNGs into the image cache, ``cached load`` maps them from it. The random USPS values
compress far worse than the real file's, so the check and load spend longer on USPS here.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import json
import struct
import subprocess
import sys
import tempfile
from pathlib import Path


def make_tree(root: Path) -> None:
    """Every domain's files at the official counts, random pixels and labels."""
    import numpy as np
    from PIL import Image
    from scipy.io import savemat

    from fedshift.data.catalog.digit_five import OFFICIAL

    rng = np.random.default_rng(0)
    (root / "mnist").mkdir(parents=True)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        count = OFFICIAL["mnist"][split]
        pixels = rng.integers(0, 256, (count, 28, 28), dtype=np.uint8).tobytes()
        labels = rng.integers(0, 10, count).astype(np.uint8).tobytes()
        images = struct.pack(">IIII", 2051, count, 28, 28) + pixels
        (root / "mnist" / f"{prefix}-images-idx3-ubyte.gz").write_bytes(gzip.compress(images))
        label_file = struct.pack(">II", 2049, count) + labels
        (root / "mnist" / f"{prefix}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(label_file))
    for domain, names in (
        ("svhn", {"train": "train_32x32.mat", "test": "test_32x32.mat"}),
        ("syn", {"train": "synth_train_32x32.mat", "test": "synth_test_32x32.mat"}),
    ):
        (root / domain).mkdir()
        for split, name in names.items():
            count = OFFICIAL[domain][split]
            x = rng.integers(0, 256, (32, 32, 3, count), dtype=np.uint8)
            y = rng.integers(1, 11, (count, 1)).astype(np.uint8)
            savemat(str(root / domain / name), {"X": x, "y": y})
    (root / "usps").mkdir()
    for split, name in (("train", "usps.bz2"), ("test", "usps.t.bz2")):
        count = OFFICIAL["usps"][split]
        values, labels = rng.uniform(-1, 1, (count, 256)), rng.integers(1, 11, count)
        lines = (
            f"{labels[i]} " + " ".join(f"{j + 1}:{v:.6f}" for j, v in enumerate(values[i]))
            for i in range(count)
        )
        (root / "usps" / name).write_bytes(bz2.compress("\n".join(lines).encode()))
    for split in ("train", "test"):
        folder = root / "mnistm" / f"mnist_m_{split}"
        folder.mkdir(parents=True)
        rows = []
        for i in range(OFFICIAL["mnistm"][split]):
            image = rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)
            Image.fromarray(image).save(folder / f"{i:08d}.png")
            rows.append(f"{i:08d}.png {i % 10}")
        (root / "mnistm" / f"mnist_m_{split}_labels.txt").write_text("\n".join(rows) + "\n")


def measure(root: str, mode: str, cache_dir: str) -> None:
    """In a subprocess: check, load or only import, then print a JSON line of figures."""
    import os
    import resource
    import time

    start = time.perf_counter()
    from fedshift.data.catalog import (
        check_dataset,
        digit_five,  # noqa: F401  (the import is part of the figure)
        load_catalog,
    )

    if mode == "check":
        check_dataset("digit-five", root)
    elif mode != "imports":
        load_catalog("digit-five", root, cache_dir=cache_dir)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    times = os.times()
    figures = {
        "wall_s": round(time.perf_counter() - start, 1),
        "cpu_s": round(times.user + times.system, 1),
        "peak_rss_mib": round(usage.ru_maxrss / 1024),
    }
    print(json.dumps(figures))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", help="folder for the tree and cache (default: a temp dir)")
    parser.add_argument("--measure", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--make", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(*args.measure)
        return
    if args.make:
        make_tree(Path(args.make))
        return
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.work or scratch)
        root, cache = work / "digit-five", work / "cache"
        if not root.exists():
            print(f"writing a full-size tree to {root} ...", file=sys.stderr)
            # in a subprocess: a child forked from a large parent would inherit its peak RSS
            subprocess.run([sys.executable, __file__, "--make", str(root)], check=True)
        for label, mode in (
            ("imports only", "imports"),
            ("datasets check", "check"),
            ("first load", "load"),
            ("cached load", "load"),
        ):
            out = subprocess.run(
                [sys.executable, __file__, "--measure", str(root), mode, str(cache)],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            figures = json.loads(out.strip().splitlines()[-1])
            print(
                f"{label:15s} {figures['wall_s']:6.1f} s wall  {figures['cpu_s']:6.1f} s CPU  "
                f"peak RSS {figures['peak_rss_mib']} MiB"
            )


if __name__ == "__main__":
    main()
