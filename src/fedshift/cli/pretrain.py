"""``fedshift pretrain``: a backbone trained on one public domain (PerAda's frozen backbone).

The dataset, model and optimizer settings are run keys, resolved as ``fedshift run`` resolves
them (``--config``, the dataset/model/seed/device flags, ``--set KEY=VALUE``), so a catalog
dataset reads ``--set data_root=PATH`` as a run does."""

from __future__ import annotations

import argparse

from fedshift.cli.errors import Command, add_force_flag
from fedshift.cli.flags import add_config_arguments, add_run_flags, flag_values


def positive(kind: type):
    """An argparse type: ``kind`` (int or float) > 0, else a one-line usage error."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects a {kind.__name__}, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


#: the run flags ``fedshift pretrain`` takes (beside ``--config`` and ``--set`` for any run key)
PRETRAIN_KEYS = ("dataset", "model", "seed", "device")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--domain", required=True, help="the domain to train on (then leave it out)"
    )
    parser.add_argument(
        "--out", required=True, help="weights file to write, .pt or .pth (+ OUT.json sidecar)"
    )
    add_force_flag(parser)
    parser.add_argument("--epochs", type=positive(int), default=5)
    parser.add_argument("--lr", help="learning rate (the run key lr)")
    parser.add_argument("--batch-size", dest="batch_size", help="the run key batch_size")
    add_run_flags(parser, keys=PRETRAIN_KEYS)
    add_config_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from fedshift.config import resolve
    from fedshift.core.context import TrainConfig
    from fedshift.engine.assembly import load_config_dataset
    from fedshift.engine.compute import resolve_device
    from fedshift.pretrain import check_weights_out, pretrain

    check_weights_out(args.out, force=args.force)
    flags = flag_values(args, keys=PRETRAIN_KEYS)
    flags.update(lr=args.lr, batch_size=args.batch_size)
    cfg = resolve(args.config, flags, args.set)
    meta = pretrain(
        load_config_dataset(cfg),
        args.domain,
        args.out,
        model=cfg.model,
        train=TrainConfig.of(cfg),
        epochs=args.epochs,
        seed=cfg.seed,
        device=resolve_device(cfg.device),
        force=args.force,
    )
    print(
        f"wrote {args.out} ({meta['model']} pretrained on {meta['dataset']}/{meta['domain']}, "
        f"validation accuracy {meta['val_accuracy']:.3f}); use it with "
        f"--set algo.backbone={args.out} and keep {meta['domain']!r} out of the run"
    )
    return 0


COMMAND = Command(
    "pretrain",
    "pretrain a backbone on one public domain (PerAda's frozen backbone)",
    add_arguments,
    run,
)
