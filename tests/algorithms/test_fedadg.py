"""FedADG: the adversarial losses (exact numbers on hand-made tensors), the seeded random
projection, and private discriminators that stay on their clients."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import client_context, run_info

from fedshift.algorithms.fedadg import (
    FedADG,
    FedADGHparams,
    alignment_loss,
    discriminator_loss,
    extractor_objective,
    generator_loss,
)
from fedshift.core.context import ClientContext, SplitView, TrainConfig
from fedshift.core.record import Record
from fedshift.data.domains import Split

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


# -- one client step against the official PACS step (Haoxiang-Wang/FedADG, a copy of the
# authors' release: pacs-ours/localTrain.py, train_step), re-derived here by hand ------------

STEP_TRAIN = TrainConfig(lr=0.05, momentum=0.9, weight_decay=1e-5, batch_size=4, local_epochs=1)
STEP_LABELS = torch.tensor([0, 3, 3, 7])


def step_context(x: torch.Tensor) -> ClientContext:
    """A labeled client holding one batch of four images of classes 0, 3, 3, 7."""
    info = run_info()
    return ClientContext(
        client_id=0,
        name="c0",
        domain="d",
        role="source",
        train=SplitView(Split(x=x, y=STEP_LABELS.clone()), True, torch.device("cpu")),
        val=None,
        test=None,
        num_classes=10,
        build_model=info.build_model,
        rng=torch.Generator().manual_seed(5),
        device=torch.device("cpu"),
        train_cfg=STEP_TRAIN,
    )


def official_pacs_step(algo: FedADG, sent: Record, x: torch.Tensor, rng: torch.Generator):
    """The official PACS step on one batch, written from its description: (1) D, with F in
    eval mode and h = F(x), h' = G(z, y) held fixed, descends E[(1 − D(h'|y))² + D(h|y)²];
    (2) F and C, in train mode, descend 0.85·CE + 0.15·E[(1 − D(h|y))²] against the updated
    D; (3) G descends E[D(G(z, y)|y)²]; y = 0.7·one-hot, z ~ U(0, 1), the same z in (1)
    and (3), each network its own SGD. The official D projects h with a trainable layer:
    here, as in fedshift, the fixed seeded projection R (the documented deviation), and
    CE without the official label smoothing (documented too)."""
    order = torch.randperm(len(x), generator=rng)  # the client's batch order, then z
    images, labels = x[order].float() / 127.5 - 1.0, STEP_LABELS[order]
    z = torch.rand(len(x), algo.hp.noise_dim, generator=rng)
    cond = F.one_hot(labels, 10).float() * 0.7
    net = algo.run.build_model()
    net.load_state_dict(sent.subset("model"))
    gen, disc = algo.build_generator(), algo.build_discriminator()
    gen.load_state_dict(sent.subset("generator"))
    disc.load_state_dict(sent.subset("discriminator"))

    def sgd(module):
        cfg = STEP_TRAIN
        return torch.optim.SGD(
            module.parameters(), cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )

    def judge(features):
        return disc(features @ algo.projection, cond)

    opt_d, opt_f, opt_g = sgd(disc), sgd(net), sgd(gen)
    net.eval()
    with torch.no_grad():
        h, h_gen = net.features(images), gen(z, cond)
    ((1 - judge(h_gen)).pow(2) + judge(h).pow(2)).mean().backward()
    opt_d.step()
    net.train()
    h = net.features(images)
    loss = 0.85 * F.cross_entropy(net.classifier(h), labels) + 0.15 * (1 - judge(h)).pow(2).mean()
    opt_f.zero_grad()
    loss.backward()
    opt_f.step()
    opt_g.zero_grad()
    judge(gen(z, cond)).pow(2).mean().backward()
    opt_g.step()
    return {"model": net, "generator": gen, "discriminator": disc}


def test_fedadg_client_step_equals_the_official_pacs_step():
    """``variant=official, label_value=0.7``: one local step of F, C, G and D (BatchNorm
    buffers included) equals the official PACS step re-derived above, from the same weights,
    batch order and noise; the seed's losses (``variant=paper``) give another D."""
    hp = FedADGHparams(
        noise_dim=8, rp_dim=12, generator_hidden=16, discriminator_hidden=8, label_value=0.7
    )
    x = torch.randint(0, 256, (4, 3, 32, 32), generator=torch.Generator().manual_seed(2))
    x = x.to(torch.uint8)
    results = {}
    for variant in ("official", "paper"):
        algo = FedADG(dataclasses.replace(hp, variant=variant), run_info(0))
        state = algo.init_state()
        sent = Record().with_arrays("model", state.model)
        for part in ("generator", "discriminator"):
            sent.with_arrays(part, state.extra[part])
        ctx = step_context(x)
        expected = official_pacs_step(
            algo, sent, x, torch.Generator().set_state(ctx.rng.get_state())
        )
        results[variant] = (algo.train(ctx, sent), expected)
    reply, expected = results["official"]
    for part, module in expected.items():
        want = module.state_dict()
        got = reply.subset(part)
        assert sorted(got) == sorted(want)
        for key, value in want.items():
            assert torch.allclose(got[key].float(), value.float(), atol=1e-6), (part, key)
    paper, _ = results["paper"]
    assert not torch.allclose(
        paper.subset("discriminator")["net.0.weight"],
        expected["discriminator"].state_dict()["net.0.weight"],
        atol=1e-6,
    )
