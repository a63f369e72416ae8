"""``fedshift pretrain``: a backbone trained on one public domain (PerAda's frozen backbone)."""

from __future__ import annotations

import argparse

from fedshift.cli.errors import Command, add_force_flag
from fedshift.data.digits import NAME as DIGITS_DG


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--domain", required=True, help="the domain to train on (then leave it out)"
    )
    parser.add_argument(
        "--out", required=True, help="weights file to write, .pt or .pth (+ OUT.json sidecar)"
    )
    add_force_flag(parser)
    parser.add_argument("-d", "--dataset", default=DIGITS_DG)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--epochs", type=positive(int), default=5)
    parser.add_argument("--lr", type=positive(float), default=0.01)
    parser.add_argument("--batch-size", type=positive(int), default=64, dest="batch_size")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")


def run(args: argparse.Namespace) -> int:
    from fedshift.data import load_dataset
    from fedshift.engine.assembly import resolve_device
    from fedshift.pretrain import check_weights_out, pretrain

    check_weights_out(args.out, force=args.force)
    dataset = load_dataset(args.dataset)
    meta = pretrain(
        dataset,
        args.domain,
        args.out,
        model=args.model,
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        seed=args.seed,
        device=resolve_device(args.device),
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
