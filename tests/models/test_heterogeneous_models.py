"""Heterogeneous client models (``hetero_models``): variant parsing, block assignment, and
training with an algorithm that shares no model weights."""

from __future__ import annotations

import pytest
from helpers import run_personalized

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
