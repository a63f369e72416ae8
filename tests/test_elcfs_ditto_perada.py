"""FedDG-ELCFS (classification and segmentation), Ditto, PerAda: exact numbers and runs."""

from __future__ import annotations

import math

import pytest
import torch
from test_contract import read_history
from torch import nn

from fedshift.algorithms._common import proximal_penalty
from fedshift.algorithms.feddg_elcfs import (
    amplitude_window,
    interpolate_amplitude,
    ntxent_loss,
    region_embeddings,
)
from fedshift.algorithms.perada import kd_loss, select_candidate
from fedshift.config import resolve
from fedshift.core.errors import ConfigError
from fedshift.core.record import Kind, Record
from fedshift.engine.assembly import prepare
from fedshift.engine.federation import check_shapes
from fedshift.engine.runner import Runner
from fedshift.eval.segmentation import boundary_regions, dice_per_image, soft_dice_loss
from fedshift.models import build_model
from fedshift.pretrain import pretrain, read_sidecar


def cfg(algorithm: str, **settings):
    base = {"rounds": 2, "batch_size": 32, "device": "cpu", "target": "optdigits"}
    items = [f"{k}={v}" for k, v in {**base, **settings}.items()]
    return resolve(None, {"algorithm": algorithm}, items)


def run(tmp_path, name, dataset, algorithm, **settings):
    exp = prepare(cfg(algorithm, **settings), dataset=dataset)
    runner = Runner(exp, tmp_path / name, progress=False)
    return runner.run(), runner


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


def test_per_sample_arrays_may_differ_in_length():
    shares = {"amplitude": Kind.AMPLITUDE, "model": Kind.MODEL}
    replies = {
        0: Record(arrays={"amplitude.window": torch.zeros(3, 3, 3, 3), "model.w": torch.zeros(2)}),
        1: Record(arrays={"amplitude.window": torch.zeros(5, 3, 3, 3), "model.w": torch.zeros(2)}),
        2: Record(arrays={"amplitude.window": torch.zeros(4, 3, 1, 1), "model.w": torch.zeros(3)}),
    }
    assert set(check_shapes(replies, shares)) == {2}
    assert set(check_shapes(replies)) == {1, 2}  # without shares every dimension must agree


# -- losses on hand-made tensors ---------------------------------------------------------


def test_ntxent_exact():
    z = torch.tensor([[1.0, 0.0], [2.0, 0.0], [0.0, 1.0]])
    loss = ntxent_loss(z, torch.tensor([0, 0, 1]), temperature=1.0)
    # pairs (0,1) and (1,0): -log(e / (e + e^0)) each
    assert float(loss) == pytest.approx(math.log(1 + math.exp(-1)), abs=1e-6)
    assert float(ntxent_loss(z, torch.tensor([0, 1, 2]), 0.05)) == 0.0  # no positive pair


def test_soft_dice_loss_and_hard_dice_exact():
    probs = torch.tensor([[[[1.0, 0.5], [0.0, 0.0]]]])
    target = torch.tensor([[[[1.0, 1.0], [0.0, 0.0]]]])
    smooth = 1e-5
    expected = 1 - (2 * 1.5 + smooth) / (1.5 + 2.0 + smooth)
    assert float(soft_dice_loss(probs, target)) == pytest.approx(expected, abs=1e-7)
    pred = torch.tensor([[[1, 0], [1, 0]], [[0, 0], [0, 0]]])
    truth = torch.tensor([[[1, 1], [0, 0]], [[0, 0], [0, 0]]])
    torch.testing.assert_close(dice_per_image(pred, truth), torch.tensor([0.5, 1.0]))


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


def test_proximal_penalty_exact():
    layer = nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0]]))
        layer.bias.copy_(torch.tensor([0.0]))
    anchor = {"weight": torch.zeros(1, 2), "bias": torch.ones(1)}
    assert float(proximal_penalty(anchor, 0.5)(layer).detach()) == pytest.approx(0.25 * 6.0)


def test_kd_loss_exact():
    student = torch.tensor([[0.0, 0.0]])
    teacher = torch.tensor([[math.log(3.0), 0.0]])
    expected = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    assert float(kd_loss(student, teacher, 1.0)) == pytest.approx(expected, abs=1e-6)
    p = 3**0.5 / (3**0.5 + 1)  # τ = 2 halves the teacher's logit gap
    expected = p * math.log(p / 0.5) + (1 - p) * math.log((1 - p) / 0.5)
    batch = kd_loss(student.repeat(2, 1), teacher.repeat(2, 1), 2.0)
    assert float(batch) == pytest.approx(expected, abs=1e-6)  # batch mean


# -- models and configuration ------------------------------------------------------------


def test_unet_shapes():
    torch.manual_seed(0)
    model = build_model("unet", 10, in_channels=3, image_size=32).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert model.features(x).shape == (2, 16, 32, 32)
        assert model(x).shape == (2, 1, 32, 32)
    assert all(k.startswith(("backbone.", "head.")) for k in model.state_dict())
    with pytest.raises(ValueError, match="divisible by 8"):
        build_model("unet", 10, image_size=28)


@pytest.mark.parametrize(
    ("algorithm", "settings", "message"),
    [
        ("fedavg", {"problem": "segmentation"}, "needs a segmentation model"),
        ("ditto", {"problem": "segmentation", "model": "unet"}, "does not support problem"),
        ("fedavg", {"model": "unet"}, "use it with problem=segmentation"),
        ("fedavg", {"problem": "detection"}, "unknown problem"),
        ("fedavg", {"task": "detection"}, "unknown problem"),  # the old key name still works
    ],
)
def test_problem_errors(algorithm, settings, message):
    with pytest.raises(ConfigError, match=message):
        cfg(algorithm, **settings)


# -- runs --------------------------------------------------------------------------------


def test_elcfs_and_fedavg_segment(tmp_path, tiny_digits):
    settings = {"problem": "segmentation", "model": "unet", "rounds": 1, "sources": "mnist,syn"}
    for algorithm in ("fedavg", "feddg-elcfs"):
        summary, runner = run(tmp_path, algorithm, tiny_digits, algorithm, **settings)
        assert 0.0 <= summary["target_dice"] <= 1.0
        assert summary["target_dice"] == summary["target_accuracy"]
        assert set(summary["per_domain_dice"]) == set(tiny_digits.domain_names)
        history = read_history(runner.out)
        assert all(math.isfinite(h["train_loss"]) for h in history)


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


def test_ditto_keeps_personal_models(tmp_path, tiny_digits):
    summary, runner = run(tmp_path, "ditto", tiny_digits, "ditto")
    assert 0.0 <= summary["personalized_accuracy"] <= 1.0
    assert all("personal" in ctx.state for ctx in runner.exp.contexts.values())
    assert runner.fed.seen_shares == {"model"}


@pytest.fixture(scope="module")
def backbone(tmp_path_factory, tiny_digits):
    path = tmp_path_factory.mktemp("backbone") / "cnn-syn.pt"
    pretrain(tiny_digits, "syn", path, epochs=1, batch_size=32)
    return path


def test_pretrain_writes_weights_and_provenance(backbone):
    meta = read_sidecar(backbone)
    assert meta["domain"] == "syn" and meta["model"] == "cnn"
    state = torch.load(backbone, weights_only=True)
    assert any(k.startswith("backbone.") for k in state)


def test_perada_refuses_random_weights(tiny_digits):
    with pytest.raises(ConfigError, match="fedshift pretrain"):
        prepare(cfg("perada", sources="mnist,mnistm", server_data="syn"), dataset=tiny_digits)


def test_perada_keeps_the_pretraining_domain_out(backbone, tiny_digits):
    with pytest.raises(ConfigError, match="pretrained on domain 'syn'"):
        prepare(cfg("perada", **{"algo.backbone": backbone}), dataset=tiny_digits)
    with pytest.raises(ConfigError, match="held by a client"):
        prepare(cfg("fedavg", sources="mnist,syn", server_data="mnist"), dataset=tiny_digits)


def perada_settings(backbone, **extra) -> dict:
    """Clients mnist and mnistm, the server's unlabeled data syn (the backbone's domain)."""
    return {"sources": "mnist,mnistm", "server_data": "syn", "algo.backbone": backbone, **extra}


def test_perada_shares_adapters_and_validation_counts(tmp_path, tiny_digits, backbone):
    settings = perada_settings(backbone, **{"algo.kd_steps": 5})
    summary, runner = run(tmp_path, "perada", tiny_digits, "perada", **settings)
    algo = runner.exp.algorithm
    adapter_bytes = sum(t.numel() * t.element_size() for t in algo.init_state().model.values())
    # per round and client: the local adapter, then one int64 count for each of the two KD
    # candidates (the average and the 5th, last KD step) scored on its validation split
    assert runner.fed.seen_shares == {"adapter", "kd_val"}
    assert summary["bytes_up"] == 2 * 2 * (adapter_bytes + 2 * 8)  # 2 rounds × 2 clients
    assert 0.0 <= summary["personalized_accuracy"] <= 1.0
    # the frozen backbone is the pretrained one, untouched by training
    net = algo.global_model(runner.exp.algorithm.init_state())
    pretrained = torch.load(backbone, weights_only=True)
    for key, value in net.backbone.state_dict().items():
        assert torch.equal(value, pretrained[f"backbone.{key}"]), key


def test_perada_kd_selection_prefers_the_average_unless_beaten():
    counts = torch.tensor([100.0, 50.0])
    # candidate 0 is the average; pooled accuracies: 0.80, 0.80, 0.90, 0.90
    correct = torch.tensor([[80, 80, 95, 90], [40, 40, 40, 45]])
    assert select_candidate(correct, counts) == 2  # best, and the earlier of two equals
    # a tie with the average keeps the average (the official code's fallback)
    assert select_candidate(torch.tensor([[70, 70], [35, 35]]), counts) == 0
    # pooled over samples (110/150 vs 105/150), not a mean of the clients' accuracies
    # (0.65 vs 0.75, which would pick candidate 1)
    assert select_candidate(torch.tensor([[90, 60], [20, 45]]), counts) == 0


def test_perada_kd_keeps_a_validated_step(tmp_path, tiny_digits, backbone):
    settings = perada_settings(backbone, **{"algo.kd_steps": 6, "algo.kd_eval_every": 2})

    def history(name, **extra):
        run(tmp_path, name, tiny_digits, "perada", **settings, **extra)
        return read_history(tmp_path / name)

    # candidates: the average (step 0) and the snapshots after KD steps 2, 4 and 6
    assert all(h["kd_selected_step"] in (0.0, 2.0, 4.0, 6.0) for h in history("val"))
    # kd_selection=last keeps the last step without asking the clients
    last = history("last", **{"algo.kd_selection": "last"})
    assert all("kd_selected_step" not in h for h in last)
    with pytest.raises(ConfigError, match="kd_selection"):
        prepare(cfg("perada", **{**settings, "algo.kd_selection": "best"}), dataset=tiny_digits)
