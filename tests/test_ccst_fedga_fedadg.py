"""CCST, FedGA and FedADG: AdaIN and style statistics, the GA weight update, the FedADG
losses (exact numbers on hand-made tensors), the VGG AdaIN pipeline with local weight files,
and CCST's one-off style-bank exchange in the byte counts."""

from __future__ import annotations

import math

import pytest
import torch

from fedshift.algorithms.ccst import CCST, CCSTHparams
from fedshift.algorithms.fedadg import (
    FedADG,
    FedADGHparams,
    alignment_loss,
    discriminator_loss,
    extractor_objective,
    generator_loss,
)
from fedshift.algorithms.fedga import FedGA, FedGAHparams, ga_update, validation_error
from fedshift.config import resolve
from fedshift.core.algorithm import RunInfo
from fedshift.core.context import ClientContext, SplitView, TrainConfig
from fedshift.core.errors import ConfigError
from fedshift.core.federation import Federation
from fedshift.core.record import Record
from fedshift.core.state import ServerState
from fedshift.data.domains import Split
from fedshift.engine.assembly import prepare
from fedshift.engine.runner import Runner
from fedshift.models import build_model
from fedshift.models.adain import (
    ADAIN_EPS,
    adain,
    adain_decoder,
    instance_style,
    pooled_style,
    vgg_encoder,
)

CONTENT = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])  # (1, 1, 2, 2)


def run_info(seed: int = 0) -> RunInfo:
    def build():
        torch.manual_seed(0)
        return build_model("cnn", 10, in_channels=3, image_size=32, embed_dim=16, width=0.25)

    return RunInfo(
        num_classes=10,
        build_model=build,
        train_cfg=TrainConfig(batch_size=8),
        total_rounds=4,
        seed=seed,
        device=torch.device("cpu"),
    )


def client_context(x: torch.Tensor, client_id: int = 0, seed: int = 0) -> ClientContext:
    split = Split(x=x, y=torch.zeros(len(x), dtype=torch.int64))
    info = run_info()
    return ClientContext(
        client_id=client_id,
        name=f"c{client_id}",
        domain="d",
        role="source",
        train=SplitView(split, True, torch.device("cpu")),
        val=None,
        test=None,
        num_classes=10,
        build_model=info.build_model,
        rng=torch.Generator().manual_seed(seed),
        device=torch.device("cpu"),
        train_cfg=info.train_cfg,
    )


# -- AdaIN and style statistics -----------------------------------------------------------


def test_instance_style_uses_unbiased_variance_plus_eps():
    mean, std = instance_style(CONTENT)
    assert mean.shape == (1, 1) and float(mean) == 2.5
    assert float(std) == pytest.approx(math.sqrt(5.0 / 3.0 + ADAIN_EPS), abs=1e-6)


def test_pooled_style_is_population_statistics_from_sums():
    mean, std = pooled_style(torch.tensor([10.0]), torch.tensor([30.0]), 4)
    assert float(mean) == 2.5
    assert float(std) == pytest.approx(math.sqrt(1.25 + ADAIN_EPS), abs=1e-7)


def test_adain_exact_numbers_and_alpha_blend():
    out = adain(CONTENT, torch.tensor([10.0]), torch.tensor([2.0]))
    sigma = math.sqrt(5.0 / 3.0 + ADAIN_EPS)
    expected = torch.tensor(
        [[[[(v - 2.5) / sigma * 2.0 + 10.0 for v in row] for row in [[1, 2], [3, 4]]]]]
    )
    torch.testing.assert_close(out, expected)
    half = adain(CONTENT, torch.tensor([10.0]), torch.tensor([2.0]), alpha=0.5)
    torch.testing.assert_close(half, 0.5 * expected + 0.5 * CONTENT)


def test_adain_with_the_contents_own_style_returns_the_content():
    content = torch.randn(3, 4, 5, 6, generator=torch.Generator().manual_seed(1)) * 3 + 1
    mean, std = instance_style(content)
    torch.testing.assert_close(adain(content, mean, std), content, atol=1e-5, rtol=0)


def test_adain_applies_one_style_per_sample():
    content = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(2))
    means = torch.tensor([[0.0, 1.0, 2.0], [5.0, 6.0, 7.0]])
    stds = torch.tensor([[1.0, 1.0, 1.0], [0.5, 0.5, 0.5]])
    out_mean, _ = instance_style(adain(content, means, stds))
    torch.testing.assert_close(out_mean, means, atol=1e-5, rtol=0)


# -- CCST -----------------------------------------------------------------------------------


def test_ccst_overall_style_is_pixel_mean_and_std_in_unit_range():
    x = torch.randint(
        0, 256, (5, 3, 8, 8), dtype=torch.uint8, generator=torch.Generator().manual_seed(3)
    )
    ccst = CCST(CCSTHparams(), run_info())
    reply = ccst.style_stats(client_context(x), Record())
    pixels = (x.double() / 127.5 - 1.0 + 1.0) / 2.0
    flat = pixels.transpose(0, 1).reshape(3, -1)
    assert reply.arrays["style.mean"].shape == (1, 3)
    torch.testing.assert_close(reply.arrays["style.mean"][0], flat.mean(1).float())
    expected_std = (flat.var(1, unbiased=False) + ADAIN_EPS).sqrt().float()
    torch.testing.assert_close(reply.arrays["style.std"][0], expected_std)


def test_ccst_single_styles_have_fixed_count_even_for_small_clients():
    x = torch.randint(0, 256, (3, 3, 8, 8), dtype=torch.uint8)
    ccst = CCST(CCSTHparams(style="single", single_styles=4), run_info())
    reply = ccst.style_stats(client_context(x), Record())
    assert reply.arrays["style.mean"].shape == (4, 3) == reply.arrays["style.std"].shape


def test_ccst_bank_draws_distinct_styles_per_image_and_keeps_own_images():
    x = torch.randint(0, 256, (6, 3, 8, 8), dtype=torch.uint8)
    ccst = CCST(CCSTHparams(styles_per_image=5), run_info())
    ctx = client_context(x, client_id=1)
    bank = Record(
        arrays={
            "bank.mean": torch.rand(3, 1, 3),
            "bank.std": torch.rand(3, 1, 3) + 0.1,
            "bank.client": torch.tensor([0, 1, 2]),
        }
    )
    ccst.receive_bank(ctx, bank)
    domains = ctx.state["style_bank"]["domain"]
    assert domains.shape == (6, 3)  # L clipped to K = 3
    assert all(sorted(row.tolist()) == [0, 1, 2] for row in domains)
    # the client's own bank entry leaves the image as it is; another entry restyles it
    own = ccst.stylize(torch.zeros(1, 3, 8, 8), torch.zeros(1, 3), torch.ones(1, 3))
    assert own.shape == (1, 3, 8, 8) and float(own.min()) >= -1.0 and float(own.max()) <= 1.0


def test_ccst_rejects_half_a_vgg_model(tmp_path):
    with pytest.raises(ConfigError, match="both"):
        CCST(CCSTHparams(vgg_weights=str(tmp_path / "vgg.pth")), run_info())
    with pytest.raises(ConfigError, match="not found"):
        CCST(
            CCSTHparams(vgg_weights=str(tmp_path / "a.pth"), decoder_weights=str(tmp_path / "b")),
            run_info(),
        )


def test_ccst_vgg_pipeline_with_local_weight_files(tmp_path):
    torch.manual_seed(0)
    encoder, decoder = vgg_encoder(), adain_decoder()
    full_vgg = dict(encoder.state_dict())
    full_vgg["31.weight"] = torch.zeros(512, 512, 3, 3)  # layers past relu4_1 are ignored
    torch.save(full_vgg, tmp_path / "vgg_normalised.pth")
    torch.save(decoder.state_dict(), tmp_path / "decoder.pth")
    hp = CCSTHparams(
        vgg_weights=str(tmp_path / "vgg_normalised.pth"),
        decoder_weights=str(tmp_path / "decoder.pth"),
    )
    ccst = CCST(hp, run_info())
    for side in (32, 28):
        x = torch.randint(0, 256, (2, 3, side, side), dtype=torch.uint8)
        reply = ccst.style_stats(client_context(x), Record())
        assert reply.arrays["style.mean"].shape == (1, 512)
        assert bool((reply.arrays["style.std"] > 0).all())
        out = ccst.stylize(
            x.float() / 127.5 - 1.0, reply.arrays["style.mean"], reply.arrays["style.std"]
        )
        assert out.shape == (2, 3, side, side)
        assert float(out.min()) >= -1.0 and float(out.max()) <= 1.0
    grey = ccst.stylize(torch.zeros(2, 1, 32, 32), torch.ones(1, 512), torch.ones(1, 512))
    assert grey.shape == (2, 1, 32, 32)


def test_ccst_bytes_include_the_one_off_style_bank(tiny_digits, tmp_path):
    settings = ["rounds=1", "batch_size=32", "device=cpu"]
    cfg = resolve(None, {"algorithm": "ccst", "target": "optdigits"}, settings)
    runner = Runner(prepare(cfg, dataset=tiny_digits), tmp_path / "ccst", progress=False)
    summary = runner.run()
    model = runner.exp.algorithm.run.build_model()
    model_bytes = Record().with_arrays("model", model.state_dict()).nbytes()
    k, channels, float_bytes = 3, 3, 4
    # one FedAvg round moves one model each way per client
    fedavg_round = k * model_bytes
    # up, once: each client's overall style (mean and std of 3 pixel channels)
    assert summary["bytes_up"] == fedavg_round + k * 2 * channels * float_bytes
    # down, once: the bank (K styles and K int64 owner ids) to each client
    bank = k * 2 * channels * float_bytes + k * 8
    assert summary["bytes_down"] == fedavg_round + k * bank


# -- FedGA ----------------------------------------------------------------------------------


def test_ga_update_paper_variant():
    new = ga_update(torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.4, 0.1, 0.1]), 0.2)
    torch.testing.assert_close(new, torch.tensor([0.7, 0.2, 0.1], dtype=torch.float64))


def test_ga_update_official_variant():
    new = ga_update(
        torch.tensor([0.5, 0.3, 0.2]), torch.tensor([0.4, 0.1, 0.1]), 0.2, variant="official"
    )
    raw = torch.tensor([0.5 + 0.2 / 3, 0.3 + 0.2 / 12, 0.2 + 0.2 / 12], dtype=torch.float64)
    torch.testing.assert_close(new, raw / raw.sum())


def test_ga_update_clips_at_zero_and_renormalizes():
    new = ga_update(torch.tensor([0.05, 0.45, 0.5]), torch.tensor([0.0, 1.0, 2.0]), 0.2)
    torch.testing.assert_close(new, torch.tensor([0.0, 0.45, 0.7], dtype=torch.float64) / 1.15)


def test_ga_update_equal_gaps_keep_the_weights():
    new = ga_update(torch.tensor([0.6, 0.4]), torch.tensor([0.3, 0.3]), 0.2)
    torch.testing.assert_close(new, torch.tensor([0.6, 0.4], dtype=torch.float64))


class CannedFederation(Federation):
    """Replies with fixed models and gaps (round 1 without gaps)."""

    def __init__(self, models, gaps):
        self.models, self.gaps = models, gaps
        self.round, self.total_rounds = 1, 4

    def clients(self, role="source"):
        return [0, 1, 2]

    def sample(self, k=None, role="source"):
        return [0, 1, 2]

    def call(self, task, ids, record):
        replies = {}
        for cid in ids:
            reply = Record(arrays={"model.w": self.models[cid]}, metrics={"loss": 1.0})
            reply.metrics["num-examples"] = 10
            if self.round > 1:
                reply.arrays["gap"] = torch.tensor([self.gaps[cid]])
            replies[cid] = reply
        return replies


def test_fedga_rounds_aggregate_with_adjusted_weights():
    models = {0: torch.tensor([3.0]), 1: torch.tensor([6.0]), 2: torch.tensor([9.0])}
    fed = CannedFederation(models, gaps={0: 0.4, 1: 0.1, 2: 0.1})
    algo = FedGA(FedGAHparams(), run_info())
    state, metrics = algo.round(ServerState(model={"w": torch.zeros(1)}), fed)
    torch.testing.assert_close(state.model["w"], torch.tensor([6.0]))  # uniform 1/3
    assert "mean_gap" not in metrics
    fed.round = 2
    state, metrics = algo.round(state, fed)
    # t = 1, d_1 = (1 - 1/4)·0.2 = 0.15; spread [0.2, -0.1, -0.1] / 0.2
    weights = torch.tensor([1 / 3 + 0.15, 1 / 3 - 0.075, 1 / 3 - 0.075], dtype=torch.float64)
    torch.testing.assert_close(state.extra["ga_weights"], weights)
    expected = float((weights * torch.tensor([3.0, 6.0, 9.0], dtype=torch.float64)).sum())
    assert float(state.model["w"]) == pytest.approx(expected, rel=1e-6)
    assert metrics["mean_gap"] == pytest.approx(0.2)


def test_fedga_rejects_unknown_base_and_variant():
    with pytest.raises(ConfigError, match="base"):
        FedGA(FedGAHparams(base="scaffold"), run_info())
    with pytest.raises(ConfigError, match="variant"):
        FedGA(FedGAHparams(variant="other"), run_info())
    with pytest.raises(ConfigError, match="gap_metric"):
        FedGA(FedGAHparams(gap_metric="f1"), run_info())


def test_fedga_validation_error_is_loss_or_error_rate():
    """Logits equal to the input, uint8 255 / 0 -> 1 / -1: rows [1, -1], [-1, 1], [-1, 1]
    with labels 0, 0, 1, so two right with margin 2 and one wrong."""
    data = SplitView(
        Split(
            x=torch.tensor([[255, 0], [0, 255], [0, 255]], dtype=torch.uint8).reshape(3, 2, 1, 1),
            y=torch.tensor([0, 0, 1]),
        ),
        True,
        torch.device("cpu"),
    )
    model = torch.nn.Flatten()
    right, wrong = math.log(1 + math.exp(-2.0)), math.log(1 + math.exp(2.0))
    loss = validation_error(model, data, batch_size=2, metric="loss")
    assert loss == pytest.approx((2 * right + wrong) / 3)
    assert validation_error(model, data, batch_size=2, metric="accuracy") == pytest.approx(1 / 3)


# -- FedADG ---------------------------------------------------------------------------------

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
