"""The per-domain protocol (FPL's setting): clients and targets, the client data fraction, and
a run reporting the mean over domains."""

from __future__ import annotations

import pytest
import torch
from helpers import close, read_history

from fedshift.config import resolve
from fedshift.core.errors import ConfigError
from fedshift.core.split import dense
from fedshift.engine.assembly import prepare
from fedshift.engine.run.runner import Runner
from fedshift.scenarios import build_scenario


def test_per_domain_clients_and_targets(digits):
    cfg = resolve(None, {"protocol": "per-domain"}, ["clients_per_domain=2"])
    assert cfg.target == "all"
    task = build_scenario(cfg, digits, pooled=False)
    assert task.targets == task.sources == digits.domain_names
    assert [c.domain for c in task.clients] == [d for d in digits.domain_names for _ in (0, 1)]
    for name in digits.domain_names:
        mine = [c for c in task.clients if c.domain == name]
        assert sum(len(c.train) for c in mine) == len(digits.domain(name).train)
        assert all(c.role == "source" for c in mine)

    subset = resolve(None, {"protocol": "per-domain", "sources": "mnist,syn"}, [])
    assert build_scenario(subset, digits, pooled=False).targets == ["mnist", "syn"]
    with pytest.raises(ConfigError, match="--target all"):
        build_scenario(
            resolve(None, {"protocol": "per-domain", "target": "mnist"}, []), digits, pooled=False
        )
    with pytest.raises(ConfigError, match="unknown domain"):
        build_scenario(
            resolve(None, {"protocol": "per-domain", "sources": "usps"}, []), digits, pooled=False
        )


def test_client_data_fraction(digits):
    settings = ["clients_per_domain=2", "client_data_fraction=0.05"]
    cfg = resolve(None, {"protocol": "per-domain"}, settings)
    full = build_scenario(
        resolve(None, {"protocol": "per-domain"}, settings[:1]), digits, pooled=False
    )
    small = build_scenario(cfg, digits, pooled=False)
    again = build_scenario(cfg, digits, pooled=False)
    for whole, part, same in zip(full.clients, small.clients, again.clients, strict=True):
        assert len(part.train) == round(0.05 * len(whole.train))
        assert len(part.val) == len(whole.val) and len(part.test) == len(whole.test)
        assert torch.equal(part.train.y, same.train.y)
        assert torch.equal(dense(part.train.x), dense(same.train.x))
    with pytest.raises(ConfigError, match="client_data_fraction"):
        resolve(None, {}, ["client_data_fraction=0"])


def test_client_data_of_domain_keeps_a_fraction_of_the_domains_training_images(digits):
    """client_data_of=domain: each client int(fraction x its domain's train + val images),
    FPL's official percent_dict, whatever the number of clients; all of its part where less."""
    settings = ["clients_per_domain=mnist:3,syn:2", "client_data_of=domain"]
    cfg = resolve(None, {"protocol": "per-domain"}, [*settings, "client_data_fraction=0.07"])
    task = build_scenario(cfg, digits, pooled=False)
    for client in task.clients:
        domain = digits.domain(client.domain)
        assert len(client.train) == int(0.07 * (len(domain.train) + len(domain.val)))
    mnist = [set(c.train.x.rows.tolist()) for c in task.clients if c.domain == "mnist"]
    assert len(mnist) == 3 and not (
        mnist[0] & mnist[1] or mnist[0] & mnist[2] or mnist[1] & mnist[2]
    )
    most = resolve(None, {"protocol": "per-domain"}, [*settings, "client_data_fraction=0.9"])
    parts = build_scenario(
        resolve(None, {"protocol": "per-domain"}, settings[:1]), digits, pooled=False
    )
    kept = build_scenario(most, digits, pooled=False)
    assert [len(c.train) for c in kept.clients] == [len(c.train) for c in parts.clients]
    with pytest.raises(ConfigError, match="client_data_of"):
        resolve(None, {}, ["client_data_of=file"])


def test_per_domain_run_reports_mean_over_domains(tmp_path, micro_digits):
    cfg = resolve(
        None,
        {"algorithm": "fpl", "protocol": "per-domain"},
        ["rounds=2", "device=cpu", "batch_size=16"],
    )
    summary = Runner(prepare(cfg, dataset=micro_digits), tmp_path / "run", progress=False).run()
    assert summary["target"] == "all" and summary["protocol"] == "per-domain"
    per_domain = summary["per_domain_accuracy"]
    assert set(per_domain) == set(micro_digits.domain_names)
    assert close(summary["target_accuracy"], sum(per_domain.values()) / len(per_domain), 1e-12)
    history = read_history(tmp_path / "run")
    assert history[0]["prototype_loss"] == 0.0 and history[1]["prototype_loss"] > 0.0
