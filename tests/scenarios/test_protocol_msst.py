"""The multi-source single-target (msst) protocol: clients, roles and label safety of the
unlabeled target, source-only baselines, and which algorithms support it."""

from __future__ import annotations

import pytest
import torch
from helpers import msst_cfg

from fedshift.config import resolve
from fedshift.core.context import LabelAccessError
from fedshift.core.errors import ConfigError
from fedshift.core.split import dense
from fedshift.engine.assembly import prepare
from fedshift.engine.run.runner import Runner
from fedshift.scenarios.msst import NO_LABEL
from fedshift.scenarios.scenario import pool_clients


def test_msst_clients_and_label_safety(tiny_digits):
    exp = prepare(msst_cfg("fact", clients_per_domain=2), dataset=tiny_digits)
    sources = [d for d in tiny_digits.domain_names if d != "optdigits"]
    assert exp.scenario.sources == sources and exp.scenario.targets == ["optdigits"]
    roles = [(c.domain, c.role) for c in exp.scenario.clients]
    assert roles == [(d, "source") for d in sources for _ in range(2)] + [("optdigits", "target")]
    target = exp.scenario.clients[-1]
    ctx = exp.contexts[target.client_id]
    assert ctx.role == "target" and not ctx.labeled
    for view in (ctx.train, ctx.val, ctx.test):
        with pytest.raises(LabelAccessError):
            _ = view.y
        with pytest.raises(LabelAccessError):
            _ = view.mask
        with pytest.raises(LabelAccessError):
            next(view.batches(8))
        # even the private split holds no real label
        assert bool((view._split.y == NO_LABEL).all()) and view._split.mask is None
    real = tiny_digits.domain("optdigits").train
    assert len(ctx.train) == len(real) and torch.equal(dense(ctx.train.x), dense(real.x))
    x, y = next(ctx.train.batches(8, labels=False, shuffle=False))
    assert y is None and x.shape[0] == 8
    source_ctx = exp.contexts[0]
    assert source_ctx.labeled and int(source_ctx.train.y.min()) >= 0


def test_msst_sources_only_for_fedavg_and_centralized(tmp_path, tiny_digits):
    exp = prepare(msst_cfg("fedavg"), dataset=tiny_digits)
    runner = Runner(exp, tmp_path, progress=False)
    target_id = exp.scenario.clients[-1].client_id
    assert target_id not in runner.fed.sample() and runner.fed.clients("target") == [target_id]
    pooled = pool_clients(exp.scenario.clients, "+".join(exp.scenario.sources))
    assert len(pooled.train) == sum(
        len(c.train) for c in exp.scenario.clients if c.role == "source"
    )
    central = prepare(msst_cfg("centralized"), dataset=tiny_digits)
    assert [c.role for c in central.scenario.clients] == ["source"]


def test_protocol_support_is_checked():
    for algorithm in ("fact", "fact-nf", "fada"):
        with pytest.raises(ConfigError, match="supported: msst"):
            resolve(None, {"algorithm": algorithm, "protocol": "lodo"}, [])
    assert resolve(None, {"algorithm": "fedavg", "protocol": "msst"}, []).protocol == "msst"
