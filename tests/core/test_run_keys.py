"""Run keys declared like hyperparameters: each ``RunConfig`` field is a ``key()`` with its
meaning, range, section and resume rule, and every reader takes them from there: the range
check, ``fedshift show run``, the generated run-keys page, ``--random``, ``--resume``,
``TrainConfig`` and the federation's options."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import run_docs_script

from fedshift.cli import main
from fedshift.core.context import TrainConfig
from fedshift.core.errors import ConfigError
from fedshift.core.runconfig import (
    RUN_KEYS,
    SECTIONS,
    RunConfig,
    check_run_values,
    describe_run_keys,
    key,
    section_keys,
)
from fedshift.core.runfiles import resume_conflict


def test_every_run_key_has_a_meaning_and_a_section():
    infos = describe_run_keys()
    assert [info.name for info in infos] == RUN_KEYS
    assert [info.name for info in infos if not info.meaning.strip()] == []
    assert {info.group for info in infos} == set(SECTIONS)


def test_a_key_in_no_known_section_or_with_an_unknown_resume_rule_is_refused():
    with pytest.raises(TypeError, match="unknown section 'trainig'"):
        key(1, "a count", group="trainig")
    with pytest.raises(TypeError, match="unknown resume rule 'grow'"):
        key(1, "a count", group="run", resume="grow")
    with pytest.raises(TypeError, match="outside its own range"):
        key(0, "a count", group="run", low=1)


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"ways": 0}, "ways must be >= 1, got 0"),
        ({"stdev": -1}, "stdev must be >= 0, got -1"),
        ({"heterogeneity_lambda": 1.5}, "heterogeneity_lambda must be in [0, 1], got 1.5"),
        ({"dirichlet_alpha": 0.0}, "dirichlet_alpha must be > 0, got 0.0"),
        ({"fraction": 0.0}, "fraction must be in (0, 1], got 0.0"),
        ({"eval_batch_size": -1}, "eval_batch_size must be >= 0, got -1"),
        ({"dp_delta": 1.0}, "dp_delta must be in (0, 1), got 1.0"),
        ({"clients_per_domain": "mnist:2,syn:0"}, "clients_per_domain of domain 'syn' must be"),
        ({"client_data_fraction": 2.0}, "client_data_fraction must be in (0, 1], got 2.0"),
        ({"optimizer": "adamw"}, "unknown optimizer 'adamw' (did you mean 'adam'?)"),
        ({"dp_clip": 1.0, "dp_noise": 0.0}, "dp_noise must be > 0 when dp_clip is set"),
    ],
)
def test_one_range_check_from_the_declarations(settings, message):
    with pytest.raises(ConfigError) as raised:
        check_run_values(RunConfig(**settings))
    assert str(raised.value).startswith(message)


def test_resume_rules_come_from_the_declarations():
    rules = {info.name: info.resume for info in describe_run_keys() if info.resume != "fixed"}
    assert rules == {
        "rounds": "may-grow",
        "device": "may-change",
        "threads": "may-change",
        "tracking": "may-change",
    }
    assert resume_conflict("device", "cpu", "cuda") == ""
    assert resume_conflict("rounds", 3, 5) == ""
    assert resume_conflict("rounds", 5, 3) == "cannot shorten"
    assert resume_conflict("lr", 0.1, 0.2) == "cannot change"
    assert resume_conflict("algo.mu", 0.1, 0.2) == "cannot change"
    assert resume_conflict("lr", 0.1, 0.1) == ""


def test_train_config_is_the_training_section():
    fields = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    defaults = RunConfig()
    assert fields == {name: getattr(defaults, name) for name in section_keys("training")}
    shared = {"lr", "momentum", "weight_decay", "batch_size", "local_epochs", "optimizer"}
    assert shared <= set(fields)
    assert TrainConfig.of(RunConfig(lr=0.5, batch_size=8)) == TrainConfig(lr=0.5, batch_size=8)


@pytest.fixture(scope="module")
def run_keys_page(tmp_path_factory) -> str:
    """The page docs/gen_run_keys.py writes."""
    out = run_docs_script("gen_run_keys.py", tmp_path_factory.mktemp("docs"))
    return (out / "run-keys.md").read_text()


def test_show_run_and_the_page_list_every_key_with_meaning_range_and_default(run_keys_page, capsys):
    assert main(["show", "run"]) == 0
    shown = {
        line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line[:2] == "  "
    }
    page = {line.split("`")[1]: line for line in run_keys_page.splitlines() if line[:3] == "| `"}
    assert set(page) == set(RUN_KEYS) and set(RUN_KEYS) <= set(shown)
    for info in describe_run_keys():
        row = shown[info.name]
        assert info.meaning in row and repr(info.default) in row and info.range_text in row
        cells = [cell.strip() for cell in page[info.name].split(" | ")]
        assert cells[2] == f"`{info.default!r}`" and cells[3] == info.range_text.replace("|", "\\|")
        assert cells[-1].rstrip(" |").endswith(info.meaning.replace("|", "\\|"))
    assert "| `lr` | float | `0.01` | > 0 | log-uniform [0.001, 0.1] | fixed | η learning rate" in (
        run_keys_page
    )


def test_run_flags_take_their_help_from_the_declarations(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--rounds ROUNDS communication rounds (default 30)" in text
    assert "--seed SEED seeds the run: model init, sampling, local batches (default 0)" in text


def test_show_run_says_channels_last_auto_is_on_where_the_run_turns_it_on(capsys):
    """#47: ``show run`` said ``auto`` means "on with CUDA", but the run also turns it on on
    the CPU for a model asking for it (EfficientNet-Lite); the text names both cases."""
    import torch

    from fedshift.engine.compute import uses_channels_last

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    cpu = torch.device("cpu")
    assert not uses_channels_last("auto", cpu, model)
    model.cpu_channels_last = True  # what the EfficientNet-Lite backbones set
    assert uses_channels_last("auto", cpu, model)
    assert main(["show", "run"]) == 0
    line = next(row for row in capsys.readouterr().out.splitlines() if "channels_last " in row)
    assert "auto (on with CUDA, and on the CPU for the EfficientNet-Lite backbones" in line
