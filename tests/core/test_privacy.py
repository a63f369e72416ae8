"""Differential privacy rules: exact clipping, the noise's stated scale, withheld classes."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import t

from fedshift.core.privacy import (
    PrivacyAccountant,
    clip_update,
    private_model_mean,
    private_prototype_mean,
    update_norm,
    withhold_and_clip_prototypes,
)


def test_clipping_scales_the_whole_update_as_one_vector():
    update = {"a": torch.tensor([3.0, 0.0]), "b": torch.tensor([4.0]), "n": torch.tensor(7)}
    assert update_norm(update) == 5.0
    clipped = clip_update(update, 1.0)
    assert torch.allclose(clipped["a"], torch.tensor([0.6, 0.0], dtype=torch.float64))
    assert torch.allclose(clipped["b"], torch.tensor([0.8], dtype=torch.float64))
    assert clipped["n"] == 7
    assert torch.equal(clip_update(update, 10.0)["a"], update["a"].double())


def test_model_mean_without_noise_is_the_mean_of_clipped_updates():
    g = {"w": torch.zeros(2), "count": torch.tensor(4)}
    clients = [
        {"w": torch.tensor([3.0, 4.0]), "count": torch.tensor(9)},
        {"w": torch.tensor([0.5, 0.0]), "count": torch.tensor(1)},
    ]
    out = private_model_mean(
        g, clients, clip=1.0, noise_multiplier=0.0, generator=torch.Generator()
    )
    # client 0 clipped to (0.6, 0.8); client 1 kept; mean over n = 2
    assert torch.allclose(out["w"], torch.tensor([0.55, 0.4]))
    assert out["w"].dtype == torch.float32
    assert out["count"] == 4  # integer buffers keep the global value


@pytest.mark.parametrize("n", [1, 4])
def test_model_noise_has_the_stated_standard_deviation(n):
    g = {"w": torch.zeros(200_000)}
    clients = [{"w": torch.zeros(200_000)} for _ in range(n)]
    gen = torch.Generator().manual_seed(0)
    out = private_model_mean(g, clients, clip=2.0, noise_multiplier=1.5, generator=gen)
    expected = 1.5 * 2.0 / n
    assert abs(float(out["w"].std()) / expected - 1) < 0.01
    assert abs(float(out["w"].mean())) < 4 * expected / math.sqrt(200_000)


def test_model_mean_divides_by_the_sampled_count_not_the_replies():
    """DP-FedAvg's fixed denominator: 2 of 4 sampled clients replied; the mean is over 4
    (the missing two are zero updates) and the noise is z·C/4, whoever replied."""
    g = {"w": torch.zeros(2)}
    clients = [{"w": torch.tensor([3.0, 4.0])}, {"w": torch.tensor([0.5, 0.0])}]
    out = private_model_mean(
        g, clients, clip=1.0, noise_multiplier=0.0, generator=torch.Generator(), denominator=4
    )
    assert torch.allclose(out["w"], torch.tensor([(0.6 + 0.5) / 4, 0.8 / 4]))
    big = {"w": torch.zeros(200_000)}
    gen = torch.Generator().manual_seed(0)
    noisy = private_model_mean(
        big, [big], clip=2.0, noise_multiplier=1.5, generator=gen, denominator=4
    )
    assert abs(float(noisy["w"].std()) / (1.5 * 2.0 / 4) - 1) < 0.01
    with pytest.raises(ValueError, match="more client models than the denominator 1"):
        private_model_mean(g, clients, 1.0, 1.0, torch.Generator(), denominator=1)
    with pytest.raises(ValueError, match="positive client count"):
        private_model_mean(g, clients, 1.0, 1.0, torch.Generator(), denominator=0)


def test_withheld_classes_are_absent_and_prototypes_are_clipped():
    protos = {0: torch.tensor([6.0, 8.0]), 1: torch.tensor([0.3, 0.4]), 2: torch.ones(2)}
    counts = {0: 10, 1: 5, 2: 2}
    kept, kept_counts = withhold_and_clip_prototypes(protos, counts, clip=1.0, min_count=5)
    assert sorted(kept) == [0, 1] and kept_counts == {0: 10, 1: 5}
    scale = 1.0 / math.sqrt(6.0**2 + 8.0**2 + 0.3**2 + 0.4**2)  # the set is clipped as one
    assert torch.allclose(kept[0], protos[0] * scale)
    assert torch.allclose(kept[1], protos[1] * scale)
    small = withhold_and_clip_prototypes({0: protos[1]}, {0: 9}, clip=1.0, min_count=5)[0]
    assert torch.equal(small[0], protos[1])  # inside the ball: unchanged


def release_sums(tables, clip, classes, dim, denominator):
    """The noiseless release times its denominator: the per-class sums, one vector a class."""
    means = private_prototype_mean(
        tables, clip, 0.0, torch.Generator(), num_classes=classes, dim=dim, denominator=denominator
    )
    return {c: means[c].double() * denominator for c in means}


@pytest.mark.parametrize("classes", [3, 10])
def test_one_client_moves_a_prototype_release_by_at_most_the_clip_norm(classes):
    """The sensitivity the accountant assumes, computed directly: one adversarial client
    (every class, every prototype far outside the ball, as it would send when it skips
    clipping) present or zeroed, with the same sampled count, moves the release's sums —
    all classes as one vector — by at most C, and the released classes stay the same."""
    gen = torch.Generator().manual_seed(3)
    clip, dim, sampled = 1.5, 16, 5
    others = [
        {c: torch.randn(dim, generator=gen) for c in range(classes) if (c + i) % 3}
        for i in range(4)
    ]
    attacker = {c: 1e3 * torch.randn(dim, generator=gen) for c in range(classes)}
    without = release_sums(others, clip, classes, dim, sampled)
    with_ = release_sums([*others, attacker], clip, classes, dim, sampled)
    assert sorted(without) == sorted(with_) == list(range(classes))
    moved = sum(float((with_[c] - without[c]).square().sum()) for c in with_)
    assert math.sqrt(moved) <= clip * (1 + 1e-6)  # the release is float32
    assert math.sqrt(moved) > 0.99 * clip  # the attacker's whole budget, not less


def test_prototype_noise_is_z_c_over_the_sampled_count_for_every_class():
    """Noise of standard deviation z·C/m on every class — sent by two clients, by one, or
    by nobody — with m the sampled count, not the number of senders."""
    dim = 100_000
    tables = [{0: torch.zeros(dim), 1: torch.zeros(dim)}, {0: torch.zeros(dim)}]
    out = private_prototype_mean(
        tables, 1.0, 2.0, torch.Generator().manual_seed(1), num_classes=3, dim=dim, denominator=4
    )
    assert sorted(out) == [0, 1, 2]
    for label in out:
        assert abs(float(out[label].std()) / (2.0 / 4) - 1) < 0.02


def test_prototype_release_divides_clipped_sums_by_the_sampled_count():
    def noiseless(tables, denominator):
        return private_prototype_mean(
            tables, 1.0, 0.0, torch.Generator(), num_classes=4, dim=2, denominator=denominator
        )

    exact = noiseless([{3: torch.tensor([30.0, 40.0])}], 1)
    assert torch.allclose(exact[3], torch.tensor([0.6, 0.8]))
    assert all(torch.equal(exact[c], torch.zeros(2)) for c in range(3))
    assert torch.allclose(noiseless([{3: torch.tensor([30.0, 40.0])}], 2)[3], t([0.3, 0.4]))
    both = noiseless([{0: torch.tensor([3.0, 0.0]), 1: torch.tensor([0.0, 4.0])}], 1)
    assert torch.allclose(both[0], torch.tensor([0.6, 0.0]))  # server re-clips the set jointly
    assert torch.allclose(both[1], torch.tensor([0.0, 0.8]))
    two = noiseless(
        [{0: torch.tensor([0.3, 0.0])}, {0: torch.tensor([0.0, 0.4]), 2: t([0.1, 0])}], 3
    )
    assert torch.allclose(two[0], torch.tensor([0.1, 0.4 / 3]))
    assert torch.allclose(two[2], torch.tensor([0.1 / 3, 0.0]))


def test_prototype_release_refuses_what_it_cannot_account():
    def release(tables, denominator=2):
        return private_prototype_mean(
            tables, 1.0, 1.0, torch.Generator(), num_classes=3, dim=2, denominator=denominator
        )

    with pytest.raises(ValueError, match="class below 3"):
        release([{5: torch.ones(2)}])
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        release([{0: torch.ones(3)}])
    with pytest.raises(ValueError, match="denominator of 1"):
        release([{0: torch.ones(2)}, {1: torch.ones(2)}], denominator=1)
    with pytest.raises(ValueError, match="positive"):
        release([], denominator=0)


def test_accountant_matches_opacus_and_survives_a_checkpoint():
    from opacus.accountants import RDPAccountant

    acc = PrivacyAccountant(noise_multiplier=1.1, delta=1e-5)
    assert acc.epsilon() == 0.0
    reference = RDPAccountant()
    for _ in range(10):
        acc.step(sample_rate=0.5)
        reference.step(noise_multiplier=1.1, sample_rate=0.5)
    assert acc.rounds == 10
    assert acc.epsilon() == pytest.approx(reference.get_epsilon(delta=1e-5))
    restored = PrivacyAccountant(noise_multiplier=1.1, delta=1e-5)
    restored.load(acc.state())
    assert restored.epsilon() == acc.epsilon()
    acc.step(sample_rate=0.5)
    assert acc.epsilon() > restored.epsilon()
    with pytest.raises(ValueError, match="noise_multiplier"):
        PrivacyAccountant(0.0, 1e-5)


# -- through real runs ------------------------------------------------------------------------


def _run(tmp_path, name, dataset, algorithm="fedavg", **overrides):
    from test_contract import make_cfg

    from fedshift.engine.assembly import prepare
    from fedshift.engine.run.runner import Runner

    exp = prepare(make_cfg(algorithm, rounds=2, **overrides), dataset=dataset)
    runner = Runner(exp, tmp_path / name, progress=False)
    return runner.run(), runner


def test_dp_fedavg_reports_epsilon_and_is_reproducible(tmp_path, micro_digits):
    from fedshift.core.privacy import PrivacySettings, run_epsilon
    from fedshift.core.state import load_checkpoint

    dp = {"dp_clip": 0.5, "dp_noise": 0.8, "threads": 1}
    first, runner = _run(tmp_path, "a", micro_digits, **dp)
    second, _ = _run(tmp_path, "b", micro_digits, **dp)
    plain, _ = _run(tmp_path, "c", micro_digits, threads=1)
    settings = PrivacySettings(0.5, 0.8, 1e-5, 5)
    assert first["dp_epsilon"] == pytest.approx(run_epsilon(settings, 2, 1.0))
    assert "dp_epsilon" not in plain
    a = load_checkpoint(tmp_path / "a" / "checkpoint.pt")["server"]["model"]
    b = load_checkpoint(tmp_path / "b" / "checkpoint.pt")["server"]["model"]
    c = load_checkpoint(tmp_path / "c" / "checkpoint.pt")["server"]["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].is_floating_point())


def test_dp_fedproto_withholds_rare_classes(tmp_path, micro_digits):
    min_count = 5
    summary, runner = _run(
        tmp_path, "p", micro_digits, "fedproto", dp_clip=1.0, dp_noise=0.5, dp_min_count=min_count
    )
    assert summary["failed_clients"] == 0
    sent = load_state(runner)["extra"]["client_classes"]
    withheld = 0
    for cid, ctx in runner.exp.contexts.items():
        if ctx.role != "source":
            continue
        counts = torch.bincount(ctx.train.y, minlength=10)
        frequent = [c for c in range(10) if counts[c] >= min_count]
        withheld += 10 - len(frequent) - int((counts == 0).sum())
        assert sent[str(cid)] == frequent
    assert withheld > 0  # the test data has rare classes, so withholding was exercised


def load_state(runner):
    from fedshift.core.state import load_checkpoint

    return load_checkpoint(runner.checkpoint_path)["server"]


def test_dp_needs_an_algorithm_it_covers_and_sane_values():
    from test_contract import make_cfg

    from fedshift.core.errors import ConfigError

    with pytest.raises(ConfigError, match="does not cover; it runs with: .*fedavg"):
        make_cfg("ccst", dp_clip=1.0)
    with pytest.raises(ConfigError, match="dp_noise must be > 0"):
        make_cfg("fedavg", dp_clip=1.0, dp_noise=0)
    with pytest.raises(ConfigError, match="dp_delta"):
        make_cfg("fedavg", dp_delta=1.5)
    with pytest.raises(ConfigError, match="cannot be combined with aggregator=median"):
        make_cfg("fedavg", dp_clip=1.0, aggregator="median")
