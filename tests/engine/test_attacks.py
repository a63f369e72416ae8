"""The attack harness (malicious clients in the simulation engine) and robust aggregation in
whole runs: each attack changes a malicious reply as defined, honest replies stay untouched,
attacked replies pass validation, and the run keys are checked before any work."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import cfg, run
from test_contract import FAST_SETTINGS, backbone_settings, make_cfg

from fedshift.algorithms import REGISTRY
from fedshift.core.errors import ConfigError
from fedshift.core.record import Kind, Record
from fedshift.core.robust import Aggregator
from fedshift.core.schema import echo
from fedshift.core.split import dense
from fedshift.engine.assembly import prepare
from fedshift.engine.federation import validate_reply
from fedshift.engine.run.runner import Runner
from fedshift.engine.simulation.attacks import AttackPlan, alie_z, parse_attack_clients
from fedshift.engine.simulation.dispatch import SimulationFederation

MODEL_SHARES = {"model": Kind.MODEL}


def model_call():
    """One call: the server sent w=[1, 1]; clients 0 and 1 are honest, client 2 malicious."""
    sent = Record(arrays={"model.w": torch.tensor([1.0, 1.0]), "model.n": torch.tensor(4)})
    rows = {0: [2.0, 3.0], 1: [4.0, 5.0], 2: [3.0, 3.0]}
    replies = {
        cid: Record(
            arrays={"model.w": torch.tensor(row), "model.n": torch.tensor(5)},
            metrics={"num-examples": 10},
        )
        for cid, row in rows.items()
    }
    return {cid: sent for cid in rows}, replies


def attacked(kind: str, strength: float | None):
    sends, replies = model_call()
    AttackPlan(kind, [2], strength, MODEL_SHARES, 10).apply(sends, replies)
    assert replies[0].arrays["model.w"].tolist() == [2.0, 3.0]  # honest: untouched
    assert replies[1].arrays["model.w"].tolist() == [4.0, 5.0]
    assert int(replies[2].arrays["model.n"]) == 5  # integer buffers: untouched
    return replies[2].arrays["model.w"].tolist()


def test_sign_flip_negates_and_scales_the_update():
    # update = [3, 3] - [1, 1] = [2, 2]
    assert attacked("sign-flip", 1.0) == [-1.0, -1.0]
    assert attacked("sign-flip", 3.0) == [-5.0, -5.0]


def test_ipm_sends_minus_epsilon_times_the_honest_mean_update():
    # honest updates [1, 2] and [3, 4]: mean [2, 3]; 1 - 0.5 * [2, 3]
    assert attacked("ipm", 0.5) == [0.0, -0.5]


def test_alie_sends_mean_minus_z_std_of_the_honest_updates():
    # mean [2, 3], population std [1, 1]; 1 + [2, 3] - 2 * [1, 1]
    assert attacked("alie", 2.0) == [1.0, 2.0]
    # z_max for n=3, m=1: supporters floor(2.5) - 1 = 1, z = inv_cdf(2/3)
    z = alie_z(3, 1)
    assert z == pytest.approx(0.430727, abs=1e-6)
    assert attacked("alie", None) == pytest.approx([3.0 - z, 4.0 - z])
    assert alie_z(5, 1) == pytest.approx(0.253347, abs=1e-6)  # inv_cdf(0.6)


def test_proto_poison_swaps_class_prototypes():
    shares = {"prototype": Kind.PROTOTYPE, "count": Kind.COUNT}
    evil = Record(
        arrays={
            "prototype.0": torch.tensor([1.0, 0.0]),
            "prototype.1": torch.tensor([0.0, 1.0]),
            "prototype.2": torch.tensor([2.0, 2.0]),
            "prototype.9": torch.tensor([5.0, 5.0]),
            "count.0": torch.tensor(3),
        }
    )
    honest = Record(arrays={"prototype.0": torch.tensor([7.0, 7.0])})
    replies = {0: honest, 1: evil}
    AttackPlan("proto-poison", [1], 2.0, shares, 10).apply({0: Record(), 1: Record()}, replies)
    got = {k: v.tolist() for k, v in evil.arrays.items()}
    # 0 <-> 9 (C - 1 - c held); 1 and 2 (8, 7 not held) swap mirrored places in [0, 1, 2, 9]
    assert got == {
        "prototype.0": [10.0, 10.0],
        "prototype.1": [4.0, 4.0],
        "prototype.2": [0.0, 2.0],
        "prototype.9": [2.0, 0.0],
        "count.0": 3,
    }
    assert honest.arrays["prototype.0"].tolist() == [7.0, 7.0]


def test_proto_poison_mirrors_the_rows_of_a_class_table():
    shares = {"model": Kind.MODEL, "reference": Kind.PROTOTYPE}
    table = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    evil = Record(arrays={"reference.mu": table.clone(), "model.w": torch.ones(2)})
    replies = {0: Record(arrays={"reference.mu": table.clone()}), 1: evil}
    AttackPlan("proto-poison", [1], 1.0, shares, 3).apply({0: Record(), 1: Record()}, replies)
    assert evil.arrays["reference.mu"].tolist() == [[4.0, 5.0], [2.0, 3.0], [0.0, 1.0]]
    assert evil.arrays["model.w"].tolist() == [1.0, 1.0]  # models: untouched by this attack


@pytest.mark.parametrize("kind", ["sign-flip", "alie", "ipm"])
def test_attacked_replies_pass_reply_validation(kind):
    sends, replies = model_call()
    AttackPlan(kind, [2], None if kind == "alie" else 2.0, MODEL_SHARES, 10).apply(sends, replies)
    schema = echo(sends[2], "model")
    assert validate_reply(replies[2], schema, MODEL_SHARES, max_value=1e6, data_size=10) is None
    assert replies[2].arrays["model.w"].dtype == torch.float32


def test_attack_clients_count_or_ids():
    assert parse_attack_clients("2", [4, 1, 3]) == [1, 3]
    assert parse_attack_clients("ids:3,4", [4, 1, 3]) == [3, 4]
    with pytest.raises(ConfigError, match="choose 1..3"):
        parse_attack_clients("4", [1, 3, 4])
    with pytest.raises(ConfigError, match="7 is not one"):
        parse_attack_clients("ids:1,7", [1, 3, 4])
    with pytest.raises(ConfigError, match="a count N or ids:I,J"):
        parse_attack_clients("two", [1, 3, 4])


def test_label_flip_changes_only_the_malicious_clients_training_labels(micro_digits):
    honest = prepare(cfg("fedavg"), dataset=micro_digits)
    exp = prepare(cfg("fedavg", attack="label-flip", attack_clients="ids:1"), dataset=micro_digits)
    SimulationFederation.for_experiment(exp)
    for cid, ctx in exp.contexts.items():
        before = honest.contexts[cid]
        assert torch.equal(dense(ctx.train.x), dense(before.train.x))
        assert torch.equal(ctx.val.y, before.val.y)
        expected = 9 - before.train.y if cid == 1 else before.train.y
        assert torch.equal(ctx.train.y, expected)


def test_fedavg_under_attack_with_a_robust_aggregator_runs_and_refuses_nobody(
    tmp_path, micro_digits
):
    summary, _ = run(
        tmp_path,
        "krum",
        micro_digits,
        "fedavg",
        rounds=1,
        clients_per_domain=2,
        aggregator="krum",
        aggregator_f=1,
        attack="sign-flip",
        attack_strength=5,
    )
    assert summary["failed_clients"] == 0


def test_fedavg_with_the_median_runs_and_mean_is_todays_rule(tmp_path, micro_digits):
    default_summary, default = run(tmp_path, "default", micro_digits, "fedavg")
    mean_summary, mean = run(tmp_path, "mean", micro_digits, "fedavg", aggregator="mean")
    median_summary, median = run(tmp_path, "median", micro_digits, "fedavg", aggregator="median")
    assert median_summary["rounds"] == 2 and median_summary["failed_clients"] == 0

    def final_model(runner):
        return torch.load(runner.checkpoint_path, weights_only=True)["server"]["model"]

    today, with_mean, with_median = map(final_model, (default, mean, median))
    assert all(torch.equal(with_mean[k], today[k]) for k in today)
    assert not all(torch.equal(with_median[k], today[k]) for k in today)
    assert mean_summary["target_accuracy"] == default_summary["target_accuracy"]


@pytest.mark.parametrize(
    ("algorithm", "settings", "message"),
    [
        ("fedavg", {"attack": "sign-flop"}, "unknown attack 'sign-flop'"),
        ("fedavg", {"aggregator": "krum"}, r"needs n >= 2f\+3 = 5 clients, got 3"),
        (
            "fedavg",
            {"aggregator": "krum", "clients_per_domain": 2, "fraction": 0.5},
            "got 3 .3 source clients sampled per round",
        ),
        ("fact", {"aggregator": "median", "protocol": "msst"}, "fact combines exactly two"),
        ("fedavg", {"attack": "proto-poison"}, "needs an algorithm that sends prototypes"),
        ("fedavg", {"attack": "alie", "attack_clients": "ids:0,9"}, "9 is not one"),
    ],
)
def test_bad_settings_are_config_errors_before_training(micro_digits, algorithm, settings, message):
    with pytest.raises(ConfigError, match=message):
        exp = prepare(cfg(algorithm, **settings), dataset=micro_digits)
        SimulationFederation.for_experiment(exp)


@dataclasses.dataclass(frozen=True)
class CountingAggregator(Aggregator):
    """A rule counting its calls: proves a server program went through the run's rule."""

    calls: list = dataclasses.field(default_factory=list, compare=False)

    def __call__(self, items, weights):
        self.calls.append(len(items))
        return super().__call__(items, weights)


#: algorithms whose server averages models or prototypes; FACT (pairs of sources) refuses
#: every rule but its own mean instead (see the settings test above)
AVERAGING = [
    name
    for name, cls in REGISTRY.items()
    if {Kind.MODEL, Kind.PROTOTYPE} & set(cls.shares.values()) and not name.startswith("fact")
]


@pytest.mark.parametrize("algorithm", AVERAGING)
def test_every_averaging_algorithm_combines_through_the_runs_rule(
    algorithm, tmp_path, tiny16_digits
):
    settings = {
        **backbone_settings(REGISTRY[algorithm], tmp_path, tiny16_digits),
        **FAST_SETTINGS.get(algorithm, {}),
        "rounds": 1,
    }
    exp = prepare(make_cfg(algorithm, **settings), dataset=tiny16_digits)
    counting = CountingAggregator("median")
    exp.algorithm.run = dataclasses.replace(exp.algorithm.run, aggregator=counting)
    Runner(exp, tmp_path / "run", progress=False).run()
    assert counting.calls
