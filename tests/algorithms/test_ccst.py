"""CCST: AdaIN and style statistics (exact numbers on hand-made tensors), the style bank, the
VGG AdaIN pipeline with local weight files, and the one-off style-bank exchange in the byte
counts."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import client_context, run_info

from fedshift.algorithms.ccst import CCST, CCSTHparams
from fedshift.config import resolve
from fedshift.core.errors import ConfigError, ModelError
from fedshift.core.federation import fold_all
from fedshift.core.record import Record
from fedshift.engine.assembly import prepare
from fedshift.engine.run.runner import Runner
from fedshift.models.adain import (
    ADAIN_EPS,
    adain,
    adain_decoder,
    instance_style,
    pooled_style,
    vgg_encoder,
)

CONTENT = torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]])  # (1, 1, 2, 2)


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
    with pytest.raises(ModelError, match="not found"):
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


class _TwoClients:
    """A federation whose two clients reply with hand-made models (sizes 1 and 3)."""

    def sample(self, k=None, role="source"):
        return [0, 1]

    def call(self, task, ids, record, fold=None):
        replies = {
            0: Record(arrays={"model.w": torch.tensor([0.0])}, metrics={"num-examples": 1}),
            1: Record(arrays={"model.w": torch.tensor([4.0])}, metrics={"num-examples": 3}),
        }
        return fold_all(replies, fold)


@pytest.mark.parametrize(("aggregation", "expected"), [("weighted", 3.0), ("uniform", 2.0)])
def test_ccst_weighted_or_uniform_server_mean(aggregation, expected):
    from fedshift.core.state import ServerState

    algo = CCST(CCSTHparams(aggregation=aggregation), run=run_info())
    state, _ = algo.round(ServerState(model={"w": torch.tensor([9.0])}), _TwoClients())
    # weighted: (1·0 + 3·4) / 4 = 3; uniform (official 1/K): (0 + 4) / 2 = 2
    assert torch.equal(state.model["w"], torch.tensor([expected]))
