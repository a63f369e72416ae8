"""Chance is not a result: a round whose every scored domain sits exactly at one class's
share (one class predicted for every image) is said so at the run's end and marked in the
report's table."""

from __future__ import annotations

from helpers import cfg

from fedshift.engine.assembly import prepare
from fedshift.engine.evaluation import at_chance
from fedshift.report.aggregate import markdown, table
from fedshift.report.table import format_summary


def class_share(dataset, domain: str, label: int) -> float:
    labels = dataset.domain(domain).test.y
    return float((labels == label).sum()) / len(labels)


def test_every_domain_at_a_class_share_is_chance(tiny_digits):
    exp = prepare(cfg("fedavg", rounds=1), dataset=tiny_digits)
    names = tiny_digits.domain_names
    chance = {d: class_share(tiny_digits, d, 3) for d in names}
    assert at_chance(exp, chance)
    # one domain a hair off its class share: the model predicts more than one class there
    off = {**chance, names[0]: chance[names[0]] + 1 / (10 * len(tiny_digits.domain(names[0]).test))}
    assert not at_chance(exp, off)
    assert not at_chance(exp, {})
    assert not at_chance(exp, {**chance, names[1]: float("nan")})


def test_a_run_at_chance_says_so_and_the_report_marks_its_cell():
    base = {
        "algorithm": "fedavg", "dataset": "digits-dg", "protocol": "lodo", "target": "mnistm",
        "seed": 0, "rounds": 2, "selected_round": 2, "target_accuracy": 0.1,
        "target_accuracy_last": 0.1, "target_accuracy_oracle": 0.1, "oracle_round": 2,
        "per_domain_accuracy": {"mnistm": 0.1}, "bytes_up": 0, "bytes_down": 0,
        "wall_seconds": 1.0, "samples_per_second": 1.0,
    }  # fmt: skip
    flagged = {**base, "at_chance": True, "at_chance_last": True}
    text = format_summary(flagged)
    assert "warning: at the selected round every scored domain" in text
    assert "warning: at the last round" in text
    assert "warning" not in format_summary(base)
    other = {**base, "target": "syn", "target_accuracy": 0.4}
    header, body = table([flagged, other])
    assert body[0][1:3] == ["10.0 (chance)", "40.0"]
    assert "(chance)" in markdown(header, body)
    _, plain = table([base, other])
    assert plain[0][1] == "10.0"
