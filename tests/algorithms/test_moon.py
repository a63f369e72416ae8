"""MOON: the model-contrastive loss (exact numbers) and the projection network."""

from __future__ import annotations

import math

import torch
from helpers import close

from fedshift.algorithms.moon import MoonNet, model_contrastive_loss


def test_moon_loss_exact():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    z_glob = torch.tensor([[3.0, 0.0], [0.0, 1.0]])  # cosine 1 with z
    z_prev = torch.tensor([[0.0, 1.0], [1.0, 1.0]])  # cosine 0 and 1/sqrt(2)
    loss = model_contrastive_loss(z, z_glob, z_prev, temperature=0.5)
    first = math.log1p(math.exp(-2.0))  # logits (2, 0)
    second = math.log1p(math.exp(2.0 / math.sqrt(2) - 2.0))  # logits (2, sqrt 2)
    assert close(loss, (first + second) / 2)
    # a client's first round: no previous model, only the positive pair -> log(1) = 0
    assert close(model_contrastive_loss(z, z_glob, None, 0.5), 0.0)


def test_moon_net_projection_and_head():
    from fedshift.models import build_model

    base = build_model("cnn", 10, in_channels=3, image_size=32, embed_dim=64)
    net = MoonNet(base, proj_dim=16, classify_projection=True)
    z, logits = net.represent(torch.zeros(3, 3, 32, 32))
    assert z.shape == (3, 16) and logits.shape == (3, 10)
    assert net.head.in_features == 16 and torch.equal(net.features(torch.zeros(3, 3, 32, 32)), z)
    base = build_model("cnn", 10, in_channels=3, image_size=32, embed_dim=64)
    on_features = MoonNet(base, proj_dim=16, classify_projection=False)
    assert on_features.head.in_features == 64
    assert on_features.represent(torch.zeros(2, 3, 32, 32))[0].shape == (2, 16)
