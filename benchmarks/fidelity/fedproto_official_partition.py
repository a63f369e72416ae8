"""FedProto's MNIST run on the official code's own clients: the same classes, the same train
images and the same test images per client as yuetan031/FedProto draws them, trained and
scored by fedshift's ``fedproto-mnist`` preset. Is the data draw the gap to the paper?

    python benchmarks/fidelity/fedproto_official_partition.py DIGIT_FIVE_ROOT OUT_DIR [--ways 3]
        [--seed 0] [--official-seed 1234] [--order FILE.npz] [--set KEY=VALUE ...]
    python benchmarks/fidelity/fedproto_official_partition.py DIGIT_FIVE_ROOT --write-order FILE.npz

The official ``exps/federated_main.py`` seeds numpy and ``random`` with ``--seed`` (default
1234), draws ``n_list`` and ``k_list`` with numpy, then ``lib/sampling.py`` (``mnist_noniid``,
``mnist_noniid_lt``) gives client i the classes ``sorted(random.sample(range(10), n_i))``, the
train images at positions ``i * 110 .. i * 110 + k_i`` of each class in the label-sorted order
of the train file (``np.argsort`` of the labels, numpy's default quicksort) and the test images
at positions ``i * 40 .. i * 40 + 40`` of each class in the label-sorted test file. Everything
but that sort is exactly repeatable. The order of equal labels depends on numpy's sort
implementation (numpy 1.25 began to argsort with AVX-512 where the CPU has it, 2.0 with AVX2):
the default is the installed numpy's order; ``--order`` reads another, written by
``--write-order`` under the numpy of your choice (that mode needs numpy only: e.g. a virtual
environment with ``numpy==1.24.4``, the last release before those SIMD sorts; the official
repository dates from 2021, its numpy version is not recorded).

Each official client becomes one domain of an in-memory dataset (one client per domain, the
whole domain its share); every other setting is the preset's (``--set`` overrides, e.g.
``input_channels=1 normalize=mnist`` for the official input). Prints fedshift's per-client
figure and the paper's formula (``fedproto_official.official_running_ratios``).
"""

from __future__ import annotations

import argparse
import gzip
import random
import statistics
import sys
from pathlib import Path
from typing import NoReturn

import numpy as np
from fedproto_official import CLASSES, official_lists

#: the official --train_shots_max (a client's train block) and mnist_noniid_lt's test block
SHOTS_MAX, TEST_SHOTS = 110, 40
#: the preset's data and partition keys, replaced by the official clients (one per domain)
PARTITION_KEYS = ("dataset", "partition", "ways", "shots", "stdev", "test_shots", "catalog_split")
#: (split name in the order file, idx file stem)
FILES = (("train", "train"), ("t10k", "t10k"))


def read_labels(path: Path) -> np.ndarray:
    """An MNIST label file (idx1, gzip) as uint8 labels. numpy only, for ``--write-order``
    under another numpy; the images are read by fedshift's own idx reader."""
    with gzip.open(path) as f:
        data = f.read()
    if int.from_bytes(data[:4], "big") != 2049:
        raise ValueError(f"{path} is no idx label file")
    return np.frombuffer(data, dtype=np.uint8, offset=8)


def label_order(labels: np.ndarray) -> np.ndarray:
    """The official sort: ``np.vstack((idxs, labels))[:, labels.argsort()]``'s index row, i.e.
    numpy's default (quicksort) argsort of the int64 labels."""
    return np.argsort(labels.astype(np.int64))


def check_order(order: np.ndarray, labels: np.ndarray, name: str) -> None:
    """Raise ValueError unless ``order`` is a permutation that sorts ``labels``."""
    if order.shape != labels.shape or not np.array_equal(np.sort(order), np.arange(len(labels))):
        raise ValueError(f"{name}: not a permutation of the {len(labels)} images")
    if np.any(np.diff(labels[order].astype(np.int64)) < 0):
        raise ValueError(f"{name}: does not sort the labels")


def official_clients(
    train_labels: np.ndarray,
    test_labels: np.ndarray,
    ways: int,
    seed: int,
    orders: tuple[np.ndarray, np.ndarray],
) -> list[tuple[list[int], np.ndarray, np.ndarray]]:
    """(classes, train file indices, test file indices) of the official 20 MNIST clients."""
    n_list, k_list = official_lists(ways, seed)  # np.random.seed(seed), then these two
    python_rng = random.Random(seed)  # random.seed(seed)
    train_order, test_order = orders
    train_begin = {c: int(np.argmax(train_labels[train_order] == c)) for c in range(CLASSES)}
    test_begin = {c: int(np.argmax(test_labels[test_order] == c)) for c in range(CLASSES)}
    clients = []
    for i, (n, k) in enumerate(zip(n_list, k_list, strict=True)):
        classes = sorted(python_rng.sample(range(CLASSES), int(n)))
        train = [train_order[train_begin[c] + i * SHOTS_MAX :][: int(k)] for c in classes]
        test = [test_order[test_begin[c] + i * TEST_SHOTS :][:TEST_SHOTS] for c in classes]
        clients.append((classes, np.concatenate(train), np.concatenate(test)))
    return clients


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, metavar="DIGIT_FIVE_ROOT")
    parser.add_argument("out", type=Path, nargs="?", metavar="OUT_DIR")
    parser.add_argument("--ways", type=int, default=3, choices=(3, 4, 5))
    parser.add_argument("--seed", type=int, default=0, help="fedshift's seed (init, batches)")
    parser.add_argument("--official-seed", type=int, default=1234, help="the official --seed")
    parser.add_argument("--order", type=Path, help="label orders written by --write-order")
    parser.add_argument("--write-order", type=Path, metavar="FILE", help="write and stop")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    if args.out is None and args.write_order is None:
        parser.error("give OUT_DIR (a run) or --write-order FILE")
    mnist = args.root / "mnist"
    try:
        labels = {key: read_labels(mnist / f"{stem}-labels-idx1-ubyte.gz") for key, stem in FILES}
    except (OSError, ValueError, IndexError) as err:
        fail(f"cannot read the MNIST label files in {mnist}: {err}")
    if args.write_order:
        np.savez(args.write_order, **{k: label_order(y) for k, y in labels.items()})
        print(f"wrote the label orders of numpy {np.__version__} to {args.write_order}")
        return
    if args.order:
        try:
            with np.load(args.order) as saved:
                orders = {key: saved[key] for key, _ in FILES}
            for key, y in labels.items():
                check_order(orders[key], y, f"{args.order} [{key}]")
        except (OSError, ValueError, KeyError) as err:
            fail(f"cannot use the label orders in {args.order}: {err}")
        order_from = str(args.order)
    else:
        orders = {key: label_order(y) for key, y in labels.items()}
        order_from = f"numpy {np.__version__}"
    settings = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            fail(f"--set expects KEY=VALUE, got {item!r}")
        settings[key.strip()] = value.strip()
    clients = official_clients(
        labels["train"], labels["t10k"], args.ways, args.official_seed,
        (orders["train"], orders["t10k"]),
    )  # fmt: skip
    own, running = train_and_score(mnist, labels, clients, settings, args)
    print(
        f"official clients, ways {args.ways}, official seed {args.official_seed}, "
        f"label order of {order_from}"
    )
    print(f"mean classes per client {np.mean([len(c) for c, _, _ in clients]):.2f}")
    print(
        f"fedshift per client {statistics.mean(own):.2f} ± {statistics.stdev(own):.2f}; "
        f"the paper's formula {np.mean(running):.2f} ± {np.std(running):.2f}"
    )


def train_and_score(
    mnist: Path,
    labels: dict[str, np.ndarray],
    clients: list[tuple[list[int], np.ndarray, np.ndarray]],
    settings: dict[str, str],
    args: argparse.Namespace,
) -> tuple[list[float], list[float]]:
    """Run the preset on ``clients`` (one in-memory domain each) and score the final models:
    (each client's prototype accuracy, the official running ratios), in %. fedshift and torch
    are imported here, so ``--write-order`` needs numpy only."""
    import torch
    from fedproto_official import official_running_ratios, score_clients

    import fedshift
    from fedshift.core.errors import FedshiftError
    from fedshift.core.runfiles import RunFiles
    from fedshift.core.state import load_checkpoint
    from fedshift.data.formats.idx import find_idx, read_idx
    from fedshift.presets import load_preset

    images = {}
    try:
        for key, stem in FILES:
            (count, rows, cols), pixels = read_idx(
                find_idx(mnist, f"{stem}-images-idx3-ubyte", "MNIST"), "images"
            )
            if count != len(labels[key]) or len(pixels) != count * rows * cols:
                fail(f"the MNIST {stem} images do not match their {len(labels[key])} labels")
            images[key] = np.frombuffer(pixels, dtype=np.uint8).reshape(count, rows, cols)
    except FedshiftError as err:
        fail(str(err))

    def split(key: str, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """fedshift's MNIST input: 3 identical uint8 channels (the preset normalises them)."""
        x = np.repeat(images[key][idx][:, None], 3, axis=1)
        return torch.from_numpy(x), torch.from_numpy(labels[key][idx].astype(np.int64))

    empty = np.zeros(0, dtype=np.int64)
    dataset = {
        f"client{i:02d}": {
            "train": split("train", train),
            "val": split("train", empty),
            "test": split("t10k", test),
        }
        for i, (_, train, test) in enumerate(clients)
    }
    preset = load_preset("fedproto-mnist").settings
    keys = {k: v for k, v in preset.items() if k not in PARTITION_KEYS} | settings
    keys.update(partition="iid", clients_per_domain=1, seed=args.seed)
    algo = {k.removeprefix("algo."): keys.pop(k) for k in list(keys) if k.startswith("algo.")}
    try:
        result = fedshift.run(dataset=dataset, out=args.out, algo=algo, progress=True, **keys)
        checkpoint = load_checkpoint(RunFiles(result.run_dir).checkpoint)
    except FedshiftError as err:
        fail(str(err))
    cfg = result.config
    model_keys = (cfg["model"], cfg["normalize"], cfg["input_channels"] == 1)
    tests = [(i, *split("t10k", test)) for i, (_, _, test) in enumerate(clients)]
    counts = score_clients(checkpoint, model_keys, CLASSES, tests)
    return [100 * g / t for _, g, t in counts], official_running_ratios(counts)


if __name__ == "__main__":
    main()
