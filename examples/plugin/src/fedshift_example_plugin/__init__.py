"""An example fedshift plug-in package: an algorithm, a model and a dataset.

Installed (``pip install examples/plugin``), its entry points make them available by name:
``fedshift run -a fedprox-l1 --model tiny-mlp --dataset stripes --target blue``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fedshift.algorithms.fedavg import FedAvg
from fedshift.core.hparams import BaseHparams, hp
from fedshift.models import FedModel

__all__ = ["FedProxL1", "build_tiny_mlp", "stripes"]


@dataclass(frozen=True)
class FedProxL1Hparams(BaseHparams):
    lam: float = hp(1e-4, "λ", "weight of the L1 pull towards the global model", low=0)


class FedProxL1(FedAvg):
    """FedAvg whose local loss adds λ·‖w − θ‖₁ towards the received global model θ
    (FedProx with an L1 instead of a squared L2 proximal term)."""

    name = "fedprox-l1"
    paper = "example plug-in (FedProx, Li et al., MLSys 2020, with an L1 term)"
    Hparams = FedProxL1Hparams

    def local_penalty(self, ctx, record):
        anchor = {k: v.to(ctx.device) for k, v in record.subset("model").items()}
        lam = self.hp.lam

        def penalty(model: nn.Module) -> torch.Tensor:
            terms = [
                (param - anchor[name]).abs().sum()
                for name, param in model.named_parameters()
                if param.requires_grad
            ]
            return lam * torch.stack(terms).sum()

        return penalty


def build_tiny_mlp(
    num_classes: int, *, in_channels: int = 3, image_size: int = 32, hidden: int = 64
) -> FedModel:
    """A two-layer MLP on the flattened image (option: hidden)."""
    backbone = nn.Sequential(
        nn.Flatten(), nn.Linear(in_channels * image_size * image_size, hidden), nn.ReLU()
    )
    return FedModel(
        backbone,
        nn.Linear(hidden, num_classes),
        embed_dim=hidden,
        num_classes=num_classes,
        arch="tiny-mlp",
    )


def stripes(per_domain: int = 200, size: int = 16) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Three colour domains of striped images; the class is the stripes' direction
    (0 horizontal, 1 vertical), the domain their colour. Deterministic, no download."""
    generator = torch.Generator().manual_seed(0)
    colours = {"red": (1.0, 0.2, 0.2), "green": (0.2, 1.0, 0.2), "blue": (0.2, 0.2, 1.0)}
    domains = {}
    for domain, colour in colours.items():
        labels = torch.randint(0, 2, (per_domain,), generator=generator)
        period = torch.randint(2, 5, (per_domain, 1, 1), generator=generator)
        phase = torch.randint(0, 4, (per_domain, 1, 1), generator=generator)
        line = torch.arange(size).view(1, size, 1)
        rows = ((line + phase) // period) % 2
        cols = rows.transpose(1, 2)
        pattern = torch.where(labels.view(-1, 1, 1) == 0, rows, cols).float()
        noise = 0.1 * torch.rand(per_domain, 3, size, size, generator=generator)
        images = pattern[:, None] * torch.tensor(colour).view(1, 3, 1, 1) + noise
        domains[domain] = (images.clamp(0, 1), labels)  # floats in [0, 1]
    return domains
