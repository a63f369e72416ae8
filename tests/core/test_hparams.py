"""Hyperparameters: one declaration form (BaseHparams, hp() fields with meaning, symbol and
range, Literal choices, check() for cross-field rules), every bad value a one-line
ConfigError naming the field and what is valid; describe_hparams reads the declarations."""

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
from fedshift.core.hparams import BaseHparams, describe_hparams, hp
from fedshift.core.hparams import make_hparams as build_hparams


@pytest.mark.parametrize(
    ("algorithm", "setting", "message"),
    [
        ("fedsr", "algo.l2r=cube", "unknown algo.l2r 'cube'; choose one of: squared, norm"),
        (
            "fpl",
            "algo.upcr_reduction=max",
            "unknown algo.upcr_reduction 'max'; choose one of: sum, mean",
        ),
        ("fpl", "algo.prototype_pass=test", "unknown algo.prototype_pass 'test'; choose one of"),
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
    with pytest.raises(ConfigError, match="unknown algo.form 'c'; choose one of: a, b"):
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


def test_every_hyperparameter_declares_its_meaning():
    for cls in REGISTRY.values():
        for info in describe_hparams(cls.Hparams):
            assert info.meaning, f"{cls.name}: algo.{info.name} has no meaning"


def test_fact_adapt_target_has_its_own_meaning():
    infos = {info.name: info for info in describe_hparams(REGISTRY["fact"].Hparams)}
    meaning = infos["adapt_target"].meaning
    assert "IDD" in meaning and "ablation" in meaning
    others = {info.meaning for name, info in infos.items() if name != "adapt_target"}
    assert meaning not in others
    assert infos["lr"].symbol == "η₀" and infos["lr"].range_text == "> 0"


def test_hp_ranges_are_checked_with_one_message_style():
    @dataclass(frozen=True)
    class Toy(BaseHparams):
        rate: float = hp(0.5, "ρ", "share of something", low=0, high=1, low_open=True)
        count: int = hp(3, "", "how many", low=1)
        form: Literal["a", "b"] = hp("a", "", "which form")

    assert build_hparams(Toy, {"rate": "1", "count": 1}) == Toy(1.0, 1, "a")
    with pytest.raises(ConfigError, match=r"algo.rate must be in \(0, 1\], got 0.0"):
        build_hparams(Toy, {"rate": 0})
    with pytest.raises(ConfigError, match="algo.count must be >= 1, got 0"):
        build_hparams(Toy, {"count": 0})
    rate, count, form = describe_hparams(Toy)
    assert (rate.name, rate.type_text, rate.default, rate.symbol) == ("rate", "float", 0.5, "ρ")
    assert rate.summary() == "ρ share of something (in (0, 1])"
    assert (count.range_text, form.type_text, form.range_text) == (">= 1", "a | b", "")


def test_hp_refuses_a_default_outside_its_range():
    with pytest.raises(TypeError, match="outside its own range >= 1"):
        hp(0, "", "how many", low=1)
    with pytest.raises(TypeError, match="open bound"):
        hp(0.5, "", "a share", high_open=True)
