"""Local training's numbers: after one round on a hand-made two-client problem each client holds
its own plain-SGD model from the shared start, and the server holds no model."""

from __future__ import annotations

import torch
from two_clients import START, plain_sgd, run_one_round

from fedshift.algorithms.local import Local


def test_each_client_keeps_its_own_plain_sgd_model():
    state, clients = run_one_round(Local)
    assert state.model == {}
    for cid, ctx in clients.items():
        expected = plain_sgd(cid)
        for key in START:
            torch.testing.assert_close(ctx.state["model"][key], expected[key], atol=1e-6, rtol=0)
    first, second = (clients[cid].state["model"]["1.weight"] for cid in (0, 1))
    assert (first - second).abs().max() > 1e-3  # nothing was averaged
