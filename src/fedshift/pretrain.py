"""Pretraining a backbone centrally on one public domain (for PerAda's frozen backbone).

``fedshift pretrain --domain syn --out backbone-syn.pt`` trains a registered model with
cross-entropy on the training split of one domain and writes its state dict (loadable with
``torch.load(weights_only=True)`` and by ``--set model_weights=...``) plus a JSON sidecar
``<out>.json`` that records where the weights come from. A run that uses the backbone must
keep that domain out of its federation and evaluation; PerAda checks the sidecar.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from fedshift.core.bounded import MAX_SIDECAR_BYTES, read_json_bounded
from fedshift.core.context import TrainConfig
from fedshift.core.errors import ConfigError
from fedshift.core.outputs import OutputKind, check_output
from fedshift.core.seeding import derive_seed
from fedshift.core.split import to_input
from fedshift.core.state import atomic_save, write_text_atomically
from fedshift.data.domains import DomainDataset
from fedshift.eval.metrics import accuracy
from fedshift.models import build_model

SIDECAR_FORMAT = "fedshift-pretrained-v1"


def sidecar_path(weights: str | Path) -> Path:
    """Where the provenance record of a weights file lives."""
    return Path(str(weights) + ".json")


def read_sidecar(weights: str | Path) -> dict[str, Any] | None:
    """The provenance record written by :func:`pretrain`, or None for foreign weights."""
    path = sidecar_path(weights)
    if not path.is_file():
        return None
    meta = read_json_bounded(path, ConfigError, MAX_SIDECAR_BYTES)
    return meta if isinstance(meta, dict) and meta.get("format") == SIDECAR_FORMAT else None


def _own_sidecar(path: Path) -> bool:
    """Whether ``path`` is a provenance record :func:`pretrain` wrote."""
    try:
        meta = read_json_bounded(path, ConfigError, MAX_SIDECAR_BYTES)
    except (ConfigError, OSError):
        return False
    return isinstance(meta, dict) and meta.get("format") == SIDECAR_FORMAT


def is_pretrained_weights(path: Path) -> bool:
    """Whether ``path`` is a weights file :func:`pretrain` wrote (its sidecar says so)."""
    return path.is_file() and _own_sidecar(sidecar_path(path))


#: what ``fedshift pretrain --out`` writes (the rule of :mod:`fedshift.core.outputs`)
WEIGHTS = OutputKind("weights file", (".pt", ".pth"), is_pretrained_weights)


def check_weights_out(out: str | Path, flag: str = "--out", *, force: bool = False) -> Path:
    """``out`` when :func:`pretrain` may write its weights and sidecar there: the output rule
    for the weights, and the sidecar ``OUT.json`` is new or one of fedshift's (or ``force``)."""
    path = check_output(out, WEIGHTS, flag, force=force)
    sidecar = sidecar_path(path)
    if (sidecar.exists() or sidecar.is_symlink()) and not force and not _own_sidecar(sidecar):
        raise ConfigError(
            f"{flag} {path}: its sidecar {sidecar} exists and is not one fedshift wrote; "
            "nothing was changed: give another path, or --force to replace it"
        )
    return path


def pretrain(
    dataset: DomainDataset,
    domain: str,
    out: str | Path,
    *,
    model: str = "cnn",
    train: TrainConfig | None = None,
    epochs: int = 5,
    seed: int = 0,
    device: str | torch.device = "cpu",
    force: bool = False,
) -> dict[str, Any]:
    """Train ``model`` on ``domain``'s training split; save weights and sidecar to ``out``.

    ``train`` is the run's training section (``TrainConfig.of(cfg)``; None: the run keys'
    defaults): its ``lr``, ``momentum``, ``weight_decay`` and ``batch_size`` drive SGD for
    ``epochs`` passes. Returns the sidecar record (with the validation accuracy on the same
    domain).
    """
    train = TrainConfig() if train is None else train
    if train.optimizer != "sgd":
        raise ConfigError(
            f"pretrain trains with SGD (PerAda's recipe); optimizer={train.optimizer!r} is "
            "not supported here"
        )
    lr, batch_size = train.lr, train.batch_size
    out = check_weights_out(out, force=force)
    split = dataset.domain(domain).train
    device = torch.device(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "pretrain-init", domain))
        net = build_model(
            model,
            dataset.num_classes,
            in_channels=dataset.channels,
            image_size=dataset.image_size,
        ).to(device)
    optimizer = torch.optim.SGD(
        net.parameters(), lr=lr, momentum=train.momentum, weight_decay=train.weight_decay
    )
    rng = torch.Generator().manual_seed(derive_seed(seed, "pretrain-order", domain))
    net.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "pretrain-torch", domain))
        for _ in range(epochs):
            order = torch.randperm(len(split), generator=rng)
            for start in range(0, len(split), batch_size):
                idx = order[start : start + batch_size]
                if len(idx) < 2:
                    continue
                x = to_input(split.x[idx], device)
                loss = F.cross_entropy(net(x), split.y[idx].to(device))
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
    val_acc = accuracy(net, dataset.domain(domain).val, device, lambda m, x: m(x))
    state = {k: v.detach().to("cpu").clone() for k, v in net.state_dict().items()}
    out = check_weights_out(out, force=force)  # again: the file may have appeared meanwhile
    atomic_save(state, out)
    meta = {
        "format": SIDECAR_FORMAT,
        "dataset": dataset.name,
        "domain": domain,
        "split": "train",
        "model": model,
        "epochs": epochs,
        "lr": lr,
        "batch_size": batch_size,
        "seed": seed,
        "image_size": dataset.image_size,
        "val_accuracy": val_acc,
    }
    write_text_atomically(sidecar_path(out), json.dumps(meta, indent=2) + "\n")
    return meta
