"""Heterogeneous client models (``hetero_models``) and each client's own initialization
(``client_init=own``): variant parsing, block assignment, seeding, and training with an
algorithm that shares no model weights."""

from __future__ import annotations

import pytest
import torch
from helpers import personalized_cfg, run_personalized

from fedshift.config import resolve
from fedshift.core.errors import ConfigError, ModelError
from fedshift.engine.assembly import prepare
from fedshift.models.registry import parse_variants, variant_of_client


def test_heterogeneous_models_train_with_prototypes(tmp_path, synthetic):
    summary, _, exp = run_personalized(
        tmp_path, synthetic, "fedproto", "het", rounds=1, hetero_models="width=0.5;width=1.0"
    )
    shapes = [ctx.state["model"]["backbone.conv1.weight"].shape[0] for ctx in exp.contexts.values()]
    assert shapes == [16, 16, 32]  # 3 clients, 2 variants: blocks of 2 and 1
    assert 0.0 <= summary["personalized_accuracy"] <= 1.0


def test_heterogeneous_models_need_an_algorithm_without_model_sharing(synthetic):
    cfg = resolve(
        None,
        {"algorithm": "fedavg", "protocol": "personalized"},
        ["device=cpu", "hetero_models=width=0.5;width=1.0"],
    )
    with pytest.raises(ConfigError, match="shares no model weights"):
        prepare(cfg, dataset=synthetic)


def test_variant_parsing_and_block_assignment():
    assert parse_variants("") == []
    assert parse_variants("fedproto")[0] == {"out_channels": (10, 18)}
    assert parse_variants("width=0.5,embed_dim=64;dropout=0.1") == [
        {"width": 0.5, "embed_dim": 64},
        {"dropout": 0.1},
    ]
    with pytest.raises(ModelError, match="key=value"):
        parse_variants("width")
    assert [variant_of_client(i, 20, 3) for i in (0, 6, 7, 13, 14, 19)] == [0, 0, 1, 1, 2, 2]


def initial_weights(cfg, synthetic) -> list[dict[str, torch.Tensor]]:
    """Each client's starting weights, in client order."""
    exp = prepare(cfg, dataset=synthetic)
    return [ctx.build_model().state_dict() for ctx in exp.contexts.values()]


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_own_client_init_gives_each_client_its_own_seeded_weights(synthetic):
    shared = initial_weights(personalized_cfg("fedproto"), synthetic)
    assert same(shared[0], shared[1]) and same(shared[1], shared[2])  # the default
    own = initial_weights(personalized_cfg("fedproto", client_init="own"), synthetic)
    assert not same(own[0], own[1]) and not same(own[1], own[2]) and not same(own[0], own[2])
    again = initial_weights(personalized_cfg("fedproto", client_init="own"), synthetic)
    assert all(same(a, b) for a, b in zip(own, again, strict=True))  # seeded
    other_seed = initial_weights(personalized_cfg("fedproto", client_init="own", seed=1), synthetic)
    assert not same(own[0], other_seed[0])


def test_own_client_init_keeps_each_clients_variant(synthetic):
    cfg = personalized_cfg("fedproto", client_init="own", hetero_models="width=0.5;width=1.0")
    own = initial_weights(cfg, synthetic)
    assert [w["backbone.conv1.weight"].shape[0] for w in own] == [16, 16, 32]
    assert not same(own[0], own[1])  # same variant, own weights


def test_own_client_init_needs_an_algorithm_without_model_sharing(synthetic):
    with pytest.raises(ConfigError, match="client_init=own needs an algorithm that shares no"):
        prepare(personalized_cfg("fedavg", client_init="own"), dataset=synthetic)
    with pytest.raises(ConfigError, match="client_init.*shared.*own"):
        personalized_cfg("fedproto", client_init="mine")
