"""FedADG: the adversarial losses (exact numbers on hand-made tensors), the seeded random
projection, and private discriminators that stay on their clients."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import client_context, run_info

from fedshift.algorithms.fedadg import (
    FedADG,
    FedADGHparams,
    alignment_loss,
    discriminator_loss,
    extractor_objective,
    generator_loss,
)
from fedshift.core.record import Record

D_GEN = torch.tensor([0.8, 0.6])


D_EXT = torch.tensor([0.2, 0.4])


def test_fedadg_discriminator_loss_both_variants():
    assert float(discriminator_loss(D_GEN, D_EXT, "paper")) == pytest.approx(-1.0)
    assert float(discriminator_loss(D_GEN, D_EXT, "official")) == pytest.approx(0.2)


def test_fedadg_generator_and_alignment_losses():
    assert float(generator_loss(D_GEN, "paper")) == pytest.approx(0.1)
    assert float(generator_loss(D_GEN, "official")) == pytest.approx(0.5)
    assert float(alignment_loss(D_EXT)) == pytest.approx(0.5)


def test_fedadg_extractor_objective_mixes_ce_and_alignment():
    total, ce, align = extractor_objective(torch.zeros(2, 2), torch.tensor([0, 1]), D_EXT, 0.85)
    assert float(ce) == pytest.approx(math.log(2.0))
    assert float(total) == pytest.approx(0.85 * math.log(2.0) + 0.15 * 0.5)


def test_fedadg_projection_is_seeded_and_shapes_fit():
    hp = FedADGHparams(noise_dim=8, rp_dim=12, generator_hidden=16, discriminator_hidden=8)
    a, b, other = FedADG(hp, run_info(0)), FedADG(hp, run_info(0)), FedADG(hp, run_info(1))
    assert a.projection.shape == (16, 12)
    assert torch.equal(a.projection, b.projection)
    assert not torch.equal(a.projection, other.projection)
    state = a.init_state()
    assert set(state.extra) == {"generator", "discriminator"}
    z, y = torch.rand(4, 8), torch.eye(10)[:4]
    h = a.build_generator()(z, y)
    assert h.shape == (4, 16) and bool((h >= 0).all())
    d = a.build_discriminator()(h @ a.projection, y)
    assert d.shape == (4,) and bool(((d > 0) & (d < 1)).all())


def test_fedadg_private_discriminators_stay_on_their_clients():
    hp = FedADGHparams(
        noise_dim=8,
        rp_dim=12,
        generator_hidden=16,
        discriminator_hidden=8,
        share_discriminator=False,
    )
    algo = FedADG(hp, run_info(0))
    state = algo.init_state()
    assert set(state.extra) == {"generator"}
    x = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    ctx = client_context(x, client_id=1)
    sent = (
        Record()
        .with_arrays("model", state.model)
        .with_arrays("generator", state.extra["generator"])
    )
    first = algo.train(ctx, sent)
    assert not any(k.startswith("discriminator.") for k in first.arrays)
    kept = {k: v.clone() for k, v in ctx.state["discriminator"].items()}
    assert not all(
        torch.equal(kept[k], v)
        for k, v in algo.seeded_discriminator("fedadg-discriminator-1").items()
    )  # it trained
    algo.train(ctx, sent)
    assert not all(torch.equal(kept[k], ctx.state["discriminator"][k]) for k in kept)
