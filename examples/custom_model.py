"""Bring your own model: register a builder, then use its name like a built-in one.

    python examples/custom_model.py [--smoke]

A model is a ``fedshift.models.FedModel``: a ``backbone`` giving flat features and a
``head`` giving logits (algorithms such as FedProto or MOON use the features).
"""

import argparse
import tempfile

from torch import nn

import fedshift
from fedshift.models import FedModel


def build_small_cnn(num_classes, *, in_channels=3, image_size=32, width=16):
    """Two conv blocks and a linear head (option: width)."""
    backbone = nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
    )
    head = nn.Linear(2 * width, num_classes)
    return FedModel(backbone, head, embed_dim=2 * width, num_classes=num_classes, arch="small")


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--smoke", action="store_true", help="tiny settings (seconds, for CI)")
parser.add_argument("--out", default=None, help="folder for the run (default: a new temp folder)")
args = parser.parse_args()
out = args.out or tempfile.mkdtemp(prefix="fedshift-example-")
size = {"rounds": 1, "client_data_fraction": 0.1, "threads": 1} if args.smoke else {"rounds": 10}

fedshift.register_model("small-cnn", build_small_cnn, "two conv blocks, global pooling")
# now `model="small-cnn"` (or --set model=small-cnn in this process) builds it
result = fedshift.run(model="small-cnn", device="cpu", out=f"{out}/small-cnn", **size)
print(f"small-cnn, FedAvg: target accuracy {result.summary['target_accuracy']:.3f}")
# for `fedshift run --model ...` on the command line, ship the builder in a plug-in package
# (examples/plugin) or name it as an import path: --model mypackage.models:build_small_cnn
