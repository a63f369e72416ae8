"""Resume is bit-identical for the server state in ``state.extra`` (moments, control
variate, drift sum) and the per-client state in ``ctx.state`` (control variates, gradient
histories), which are nested dicts of tensors the registry contract does not walk."""

from __future__ import annotations

import pytest
import torch
from test_contract import run

from fedshift.core.state import load_checkpoint


def assert_equal_nested(a, b, where: str) -> None:
    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_equal_nested(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    else:
        assert a == b, where


#: algorithm -> what its checkpoint must hold beside the model
STATE = {
    "fedavgm": ({"momentum"}, set()),
    "fedadagrad": ({"first_moment", "second_moment"}, set()),
    "fedadam": ({"first_moment", "second_moment"}, set()),
    "fedyogi": ({"first_moment", "second_moment"}, set()),
    "scaffold": ({"control"}, {"control"}),
    "feddyn": ({"drift_sum"}, {"drift"}),
}


@pytest.mark.parametrize("algorithm", list(STATE))
def test_server_and_client_state_resume_bit_for_bit(algorithm, tmp_path, tiny16_digits):
    run(tmp_path, "whole", algorithm, tiny16_digits, rounds=2)
    run(tmp_path, "resumed", algorithm, tiny16_digits, rounds=2, stop_after=1)
    run(tmp_path, "resumed", algorithm, tiny16_digits, rounds=2, resume=True)
    whole = load_checkpoint(tmp_path / "whole" / "checkpoint.pt")
    resumed = load_checkpoint(tmp_path / "resumed" / "checkpoint.pt")
    server_keys, client_keys = STATE[algorithm]
    assert set(whole["server"]["extra"]) == server_keys
    assert_equal_nested(whole["server"], resumed["server"], "server")
    trained = [state for state in whole["clients"].values() if state]
    if client_keys:
        assert trained and all(set(state) == client_keys for state in trained)
    else:
        assert not trained
    assert_equal_nested(whole["clients"], resumed["clients"], "clients")
