"""The protocol registry: one record per protocol, the only place a protocol is named."""

from __future__ import annotations

import pytest

from fedshift.config import resolve
from fedshift.core.errors import ConfigError
from fedshift.core.runconfig import RunConfig
from fedshift.scenarios import PROTOCOLS, get_protocol


def test_every_protocol_is_one_record_under_its_name():
    assert list(PROTOCOLS) == ["lodo", "personalized", "msst", "per-domain"]
    for name, protocol in PROTOCOLS.items():
        assert protocol.name == name and protocol.description and callable(protocol.build)


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_a_protocols_default_target_is_the_runs_target(name):
    expected = PROTOCOLS[name].default_target or RunConfig().target
    assert resolve(None, {"protocol": name}, []).target == expected
    assert resolve(None, {"protocol": name, "target": "syn"}, []).target == "syn"


def test_an_unknown_protocol_names_the_choices():
    with pytest.raises(ConfigError, match="unknown protocol 'lodoo' \\(did you mean 'lodo'"):
        get_protocol("lodoo")
    with pytest.raises(ConfigError, match="choose one of: lodo, personalized, msst, per-domain"):
        resolve(None, {"protocol": "leave-one-out"}, [])
