"""FedDG-ELCFS: the amplitude-spectrum window and its interpolation, the amplitude bank
exchange, the NT-Xent loss and boundary regions (exact numbers), and a first-order run."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import cfg, run

from fedshift.algorithms.feddg_elcfs import (
    amplitude_window,
    interpolate_amplitude,
    ntxent_loss,
    region_embeddings,
)
from fedshift.engine.assembly import prepare
from fedshift.engine.run.runner import Runner
from fedshift.eval.segmentation import boundary_regions

# -- amplitude spectrum ------------------------------------------------------------------


def test_window_is_centred_on_the_dc_term():
    image = torch.full((1, 3, 32, 32), 0.5)
    window = amplitude_window(image, half_width=1)
    assert window.shape == (1, 3, 3, 3)
    expected = torch.zeros(3, 3)
    expected[1, 1] = 0.5 * 32 * 32  # a constant image has only a DC term: sum of pixels
    for channel in window[0]:
        torch.testing.assert_close(channel, expected)


def test_window_matches_the_shifted_spectrum():
    image = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    amp = torch.fft.fftshift(torch.fft.fft2(image.double()).abs(), dim=(-2, -1))
    torch.testing.assert_close(amplitude_window(image, 2), amp[..., 14:19, 14:19].float())
    assert amplitude_window(image, 0).shape == (2, 3, 1, 1)  # the official L = 0 quirk: DC only


def test_lambda_zero_round_trip_returns_the_image():
    image = torch.rand(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    partner = torch.rand(4, 3, 3, 3) * 100
    out = interpolate_amplitude(image, partner, torch.zeros(4))
    torch.testing.assert_close(out, image, atol=1e-6, rtol=0)


def test_interpolation_changes_only_the_window():
    gen = torch.Generator().manual_seed(2)
    image, other = torch.rand(2, 1, 3, 16, 16, generator=gen)
    partner = amplitude_window(other, 1)
    lam = torch.tensor([0.25])
    out = interpolate_amplitude(image, partner, lam)
    amp_in = torch.fft.fftshift(torch.fft.fft2(image.double()).abs(), dim=(-2, -1))
    amp_out = torch.fft.fftshift(torch.fft.fft2(out.double()).abs(), dim=(-2, -1))
    inside = torch.zeros(16, 16, dtype=torch.bool)
    inside[7:10, 7:10] = True
    expected = 0.75 * amp_in[..., 7:10, 7:10] + 0.25 * partner.double()
    torch.testing.assert_close(amp_out[..., 7:10, 7:10], expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(amp_out[..., ~inside], amp_in[..., ~inside], atol=1e-5, rtol=1e-5)


def test_only_the_window_leaves_the_clients(tmp_path, tiny_digits):
    exp = prepare(cfg("feddg-elcfs"), dataset=tiny_digits)
    runner = Runner(exp, tmp_path / "bank", progress=False)
    fed, algo = runner.fed, exp.algorithm
    fed.begin_round(0)
    algo.setup(algo.init_state(), fed)
    sizes = {cid: len(ctx.train) for cid, ctx in exp.contexts.items()}
    assert fed.bytes_up == sum(n * 3 * 3 * 3 * 4 for n in sizes.values())  # (2b+1)² × C float32
    assert fed.seen_shares == {"amplitude"}
    for cid, ctx in exp.contexts.items():
        bank = ctx.state["amplitude_bank"]
        assert set(bank) == {str(o) for o in sizes if o != cid}  # the other clients' windows
        assert all(tuple(v.shape) == (sizes[int(k)], 3, 3, 3) for k, v in bank.items())


# -- losses on hand-made tensors ---------------------------------------------------------


def test_ntxent_exact():
    z = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]])
    loss = ntxent_loss(z, torch.tensor([0, 0, 1]), temperature=1.0)
    # pairs (0,1) and (1,0): -log(e / (e + e^0)) each
    assert float(loss) == pytest.approx(math.log(1 + math.exp(-1)), abs=1e-6)
    assert float(ntxent_loss(z, torch.tensor([0, 1, 2]), 0.05)) == 0.0  # no positive pair


def test_boundary_regions_of_a_square():
    mask = torch.zeros(1, 1, 7, 7)
    mask[0, 0, 2:5, 2:5] = 1
    contour, ring = boundary_regions(mask, ring=1)
    expected_contour = mask.clone()
    expected_contour[0, 0, 3, 3] = 0  # only the centre survives a cross erosion
    torch.testing.assert_close(contour, expected_contour)
    expected_ring = torch.zeros(1, 1, 7, 7)
    expected_ring[0, 0, 1, 2:5] = expected_ring[0, 0, 5, 2:5] = 1
    expected_ring[0, 0, 2:5, 1] = expected_ring[0, 0, 2:5, 5] = 1
    torch.testing.assert_close(ring, expected_ring)
    _, wide = boundary_regions(mask, ring=5)
    assert float(wide.sum()) == 49 - 9
    features = torch.arange(49.0).view(1, 1, 7, 7)
    centre_free = region_embeddings(features, contour)
    assert float(centre_free) == pytest.approx((features * contour).sum().item() / 8)


# -- runs --------------------------------------------------------------------------------


def test_elcfs_first_order_partner_option(tmp_path, tiny_digits):
    summary, _ = run(
        tmp_path,
        "fo",
        tiny_digits,
        "feddg-elcfs",
        rounds=1,
        **{"algo.second_order": "false", "algo.partners": 1},
    )
    assert 0.0 <= summary["target_accuracy"] <= 1.0
