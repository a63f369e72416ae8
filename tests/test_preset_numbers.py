"""Presets with the papers' settings and numbers: per-domain client counts and data fractions,
the mean of the last five evaluated rounds, and the paper's number beside fedshift's."""

from __future__ import annotations

import math

import pytest

from fedshift.config import resolve
from fedshift.core.errors import ConfigError
from fedshift.engine.run.selection import mean_of_last
from fedshift.scenarios import build_scenario


def clients_of(task) -> dict[str, int]:
    counts: dict[str, int] = {}
    for client in task.clients:
        counts[client.domain] = counts.get(client.domain, 0) + 1
    return counts


def test_clients_per_domain_mapping_allocates_exactly(digits):
    cfg = resolve(None, {"protocol": "per-domain"}, ["clients_per_domain=mnist:2,syn:3"])
    assert cfg.clients_per_domain == "mnist:2,syn:3"
    task = build_scenario(cfg, digits, pooled=False)
    assert clients_of(task) == {"mnist": 2, "mnistm": 1, "optdigits": 1, "syn": 3}
    for name in ("mnist", "syn"):
        mine = [c for c in task.clients if c.domain == name]
        assert sum(len(c.train) for c in mine) == len(digits.domain(name).train)
    lodo = resolve(None, {"target": "mnistm"}, ["clients_per_domain=mnist:2,syn:1"])
    assert clients_of(build_scenario(lodo, digits, pooled=False)) == {
        "mnist": 2,
        "optdigits": 1,
        "syn": 1,
    }


def test_plain_int_clients_per_domain_still_works(digits):
    cfg = resolve(None, {"protocol": "per-domain"}, ["clients_per_domain=2"])
    assert cfg.clients_per_domain == 2
    assert set(clients_of(build_scenario(cfg, digits, pooled=False)).values()) == {2}


def test_client_data_fraction_per_domain(digits):
    whole = build_scenario(resolve(None, {"protocol": "per-domain"}, []), digits, pooled=False)
    cfg = resolve(None, {"protocol": "per-domain"}, ["client_data_fraction=mnist:0.1,syn:0.5"])
    part = build_scenario(cfg, digits, pooled=False)
    for full, kept in zip(whole.clients, part.clients, strict=True):
        share = {"mnist": 0.1, "syn": 0.5}.get(full.domain, 1.0)
        assert len(kept.train) == max(2, round(share * len(full.train)))


@pytest.mark.parametrize(
    "setting, message",
    [
        ("clients_per_domain=mnist:2,usps:1", "clients_per_domain names unknown domain 'usps'"),
        ("clients_per_domain=mnist:x", "clients_per_domain of domain 'mnist' expects int"),
        ("clients_per_domain=mnist:1.5", "clients_per_domain of domain 'mnist' expects int"),
        ("clients_per_domain=mnist:0", "clients_per_domain of domain 'mnist' must be >= 1"),
        ("clients_per_domain=mnist:2,mnist:3", "names domain 'mnist' twice"),
        ("clients_per_domain=mnist", "expects int or DOMAIN:INT"),
        ("clients_per_domain=0", "clients_per_domain must be >= 1"),
        ("client_data_fraction=syn:1.5", "client_data_fraction of domain 'syn' must be in"),
        ("client_data_fraction=syn:", "is not DOMAIN:FLOAT"),
        ("client_data_fraction=syrn:0.5", r"unknown domain 'syrn' \(did you mean 'syn'\?\)"),
    ],
)
def test_per_domain_values_are_one_line_errors(setting, message, digits):
    with pytest.raises(ConfigError, match=message):
        build_scenario(resolve(None, {"protocol": "per-domain"}, [setting]), digits, pooled=False)


def test_mean_of_last_five_evaluated_rounds():
    history = [
        {"round": r, "target_accuracy": acc, "per_domain_accuracy": {"a": acc, "b": 1 - acc}}
        for r, acc in enumerate([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8], start=1)
    ]
    history.insert(5, {"round": 99, "target_accuracy": math.nan})  # not evaluated
    mean = mean_of_last(history)
    assert mean["rounds"] == 5
    assert mean["target_accuracy"] == pytest.approx((0.3 + 0.4 + 0.5 + 0.6 + 0.8) / 5)
    assert mean["per_domain_accuracy"]["b"] == pytest.approx(1 - 2.6 / 5)
    assert mean_of_last(history[:2])["target_accuracy"] == pytest.approx(0.15)
