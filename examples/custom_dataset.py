"""Bring your own data: map-style torch Datasets (or tensors) as the domains of a run.

    python examples/custom_dataset.py [--smoke]

Each domain is a Dataset of (image, label); float images must lie in [0, 1] or [-1, 1]
(uint8 images are taken as they are). Here: three synthetic "sensor" domains of blobs
whose class is the blob's quadrant, each domain with its own brightness and noise.
"""

import argparse
import tempfile

import torch
from torch.utils.data import Dataset

import fedshift
from fedshift.data.domains import DatasetError


class Blobs(Dataset):
    """Float images in [0, 1]: a bright blob in one of 4 quadrants (the label)."""

    def __init__(self, n, brightness, noise, seed, size=16):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, 4, (n,), generator=g)
        self.images = noise * torch.rand(n, 1, size, size, generator=g)
        half = size // 2
        for i, label in enumerate(self.labels.tolist()):
            r, c = divmod(label, 2)
            self.images[i, 0, r * half : (r + 1) * half, c * half : (c + 1) * half] += brightness
        self.images = self.images.clamp(0, 1)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], int(self.labels[i])


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--smoke", action="store_true", help="tiny settings (seconds, for CI)")
parser.add_argument("--out", default=None, help="folder for the run (default: a new temp folder)")
args = parser.parse_args()
out = args.out or tempfile.mkdtemp(prefix="fedshift-example-")
n, rounds = (60, 1) if args.smoke else (600, 10)


def sensors():
    return {
        "bright": Blobs(n, brightness=0.8, noise=0.2, seed=0),
        "dim": Blobs(n, brightness=0.4, noise=0.2, seed=1),
        "noisy": Blobs(n, brightness=0.6, noise=0.6, seed=2),
    }


# registered, the name works like a built-in dataset (a plug-in package can ship it too)
fedshift.register_dataset("sensors", sensors, "three synthetic sensor domains")
result = fedshift.run(
    dataset="sensors", target="noisy", rounds=rounds, device="cpu", threads=1, out=f"{out}/sensors"
)
print(f"sensors, target noisy: accuracy {result.summary['target_accuracy']:.3f}")

# images normalized with a mean/std leave [-1, 1]: a clear error, not chance accuracy
normalized = {"a": (torch.randn(20, 1, 16, 16) * 3, torch.zeros(20, dtype=torch.long))}
try:
    fedshift.run(dataset=normalized, target="a")
except DatasetError as error:
    print(f"DatasetError: {error}")
