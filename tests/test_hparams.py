"""Hyperparameters: one declaration form (BaseHparams, Literal choices, check()), every bad
value a one-line ConfigError naming the field and what is valid."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest

from fedshift.algorithms import REGISTRY
from fedshift.algorithms.bd_fedproto import BDFedProto
from fedshift.algorithms.fedproto import FedProto
from fedshift.algorithms.moon import Moon
from fedshift.config import make_hparams, resolve
from fedshift.core.errors import ConfigError
from fedshift.core.hparams import BaseHparams
from fedshift.core.hparams import make_hparams as build_hparams


@pytest.mark.parametrize(
    ("algorithm", "setting", "message"),
    [
        ("fedsr", "algo.l2r=cube", "algo.l2r must be one of: squared, norm; got 'cube'"),
        ("fpl", "algo.upcr_reduction=max", "algo.upcr_reduction must be one of"),
        ("fpl", "algo.prototype_pass=test", "algo.prototype_pass must be one of"),
        ("moon", "algo.temperature=0", "algo.temperature"),
        ("fact", "algo.batch_size=1", "algo.batch_size must be >= 2"),
        ("fedavg", "algo.mu=0.1", "unknown hyperparameter 'algo.mu' for algorithm 'fedavg'"),
    ],
)
def test_bad_hyperparameters_are_config_errors(algorithm, setting, message):
    protocol = (REGISTRY[algorithm].protocols or ("lodo",))[0]
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        resolve(None, {"algorithm": algorithm, "protocol": protocol}, [setting])
    assert Moon.Hparams().mu == 1.0 and Moon.Hparams().temperature == 0.5


def test_every_algorithm_declares_base_hparams_with_valid_defaults():
    for cls in REGISTRY.values():
        assert issubclass(cls.Hparams, BaseHparams), cls.name
        assert "__post_init__" not in vars(cls.Hparams), cls.name
        cls.Hparams()  # the paper defaults pass their own checks


def test_hparams_validate_choices_and_ranges_on_construction():
    @dataclass(frozen=True)
    class Toy(BaseHparams):
        form: Literal["a", "b"] = "a"
        rate: float = 0.5

        def check(self) -> None:
            if not 0 < self.rate < 1:
                raise ValueError(f"algo.rate must be in (0, 1), got {self.rate}")

    assert build_hparams(Toy, {"form": "b", "rate": "0.25"}) == Toy("b", 0.25)
    with pytest.raises(ConfigError, match="algo.form must be one of: a, b; got 'c'"):
        build_hparams(Toy, {"form": "c"})
    with pytest.raises(ConfigError, match=r"algo.rate must be in \(0, 1\), got 2.0"):
        build_hparams(Toy, {"rate": 2})  # a plain ValueError of check() is rewrapped
    with pytest.raises(ConfigError, match="algo.rate expects float"):
        build_hparams(Toy, {"rate": "fast"})
    with pytest.raises(ConfigError, match="valid: algo.form, algo.rate"):
        build_hparams(Toy, {"speed": 1}, "toy")


def test_hparams_reject_unknown_inference():
    cfg = resolve(None, {"algorithm": "fedproto"}, ["algo.inference=head"])
    assert make_hparams(cfg).inference == "head"
    assert FedProto.Hparams().inference == "own-prototypes"
    with pytest.raises(ConfigError, match="own-prototypes, all-prototypes, head"):
        resolve(None, {"algorithm": "fedproto"}, ["algo.inference=prototype"])
    with pytest.raises(ValueError, match="inference"):
        BDFedProto.Hparams(inference="all-prototypes")  # BD holds no other class's label
