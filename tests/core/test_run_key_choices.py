"""The help of a run key that names a registry entry (``protocol``, ``partition``,
``aggregator``, ``attack``) lists that registry as it is when described (``key(choices=)``),
never a copy written by hand: an entry added to the registry appears in the help."""

from __future__ import annotations

import importlib

import pytest

from fedshift.cli import main
from fedshift.core.runconfig import describe_run_keys, key

#: run key -> (module, attribute) of the registry its value names
REGISTRIES = {
    "protocol": ("fedshift.scenarios", "PROTOCOLS"),
    "partition": ("fedshift.data.partitioners", "PARTITIONERS"),
    "aggregator": ("fedshift.core.aggregator_names", "AGGREGATORS"),
    "attack": ("fedshift.core.runconfig", "ATTACKS"),
}


def meaning_of(name: str) -> str:
    return next(info.meaning for info in describe_run_keys() if info.name == name)


@pytest.mark.parametrize("name", sorted(REGISTRIES))
def test_the_help_lists_every_entry_of_the_registry(name, monkeypatch, capsys):
    module, attribute = REGISTRIES[name]
    home = importlib.import_module(module)
    entries = [str(entry) for entry in getattr(home, attribute)]
    assert len(entries) >= 4
    assert ", ".join(entries) in meaning_of(name)
    assert "{choices}" not in meaning_of(name)

    monkeypatch.setattr(home, attribute, [*entries, "added-entry"])
    assert ", ".join([*entries, "added-entry"]) in meaning_of(name)
    assert main(["show", "run"]) == 0
    shown = [line for line in capsys.readouterr().out.splitlines() if line.split()[:1] == [name]]
    assert len(shown) == 1 and "added-entry" in shown[0]


def test_choices_and_the_mark_in_the_help_go_together():
    with pytest.raises(TypeError, match="choices"):
        key("a", "one of: {choices}", group="task")
    with pytest.raises(TypeError, match="choices"):
        key("a", "one of a, b", group="task", choices="fedshift.core.runconfig:ATTACKS")
