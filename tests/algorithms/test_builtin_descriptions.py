"""``fedshift list algorithms`` and ``fedshift show ALGO`` describe a built-in whose module is
not imported from ``fedshift/algorithms/builtin_descriptions.py`` (no torch); these tests
keep that file equal to what the classes declare, and the printed text equal either way."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from fedshift import plugins
from fedshift.algorithms import BUILTINS, REGISTRY
from fedshift.algorithms.builtin_descriptions import DECLARATIONS
from fedshift.algorithms.description import declaration
from fedshift.cli import main
from fedshift.core.hparams import BaseHparams

REGENERATE = "python benchmarks/tools/gen_algorithm_descriptions.py"

#: prints ``list algorithms`` then ``show NAME`` of every built-in in a fresh interpreter (no
#: plug-ins), then the algorithm modules and torch that got imported (there should be none)
FROM_THE_FILE = """
import sys
from fedshift import plugins
plugins.entry_points = lambda group: []
from fedshift.algorithms import BUILTINS
from fedshift.cli import main
main(["list", "algorithms"])
for name in BUILTINS:
    main(["show", name])
modules = {f"fedshift.algorithms.{path.partition(':')[0]}" for path in BUILTINS.values()}
print("IMPORTED:", sorted(m for m in sys.modules if m in modules or m.split(".")[0] == "torch"))
"""


def test_the_file_holds_every_builtin():
    assert list(DECLARATIONS) == list(BUILTINS), f"regenerate it: {REGENERATE}"


@pytest.mark.parametrize("name", list(BUILTINS))
def test_the_file_says_what_the_class_declares(name):
    cls = REGISTRY[name]
    assert cls.name == name
    assert DECLARATIONS[name] == declaration(cls), (
        f"builtin_descriptions.py is stale for {name}; regenerate it: {REGENERATE}"
    )


def test_list_and_show_print_the_same_from_the_file_as_from_the_classes(monkeypatch, capsys):
    done = subprocess.run(
        [sys.executable, "-c", FROM_THE_FILE], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    from_file, _, imported = done.stdout.rpartition("IMPORTED: ")
    assert imported.strip() == "[]"  # described from the file

    monkeypatch.setattr(plugins, "entry_points", lambda group: [])
    plugins.refresh()
    for name in [name for name in REGISTRY if name not in BUILTINS]:
        monkeypatch.delitem(REGISTRY, name)  # registered by an earlier test
    for name in BUILTINS:
        REGISTRY[name]  # imported: described from the class
    try:
        assert main(["list", "algorithms"]) == 0
        for name in BUILTINS:
            assert main(["show", name]) == 0
    finally:
        plugins.refresh()
    from_classes = capsys.readouterr().out
    assert from_file == from_classes
    assert "fact-nf" in from_classes and "algo.server_lr" in from_classes


def test_a_registered_algorithm_is_described_from_its_class(monkeypatch, capsys):
    """Not a built-in: read from the class, a hyperparameter without default included."""

    @dataclasses.dataclass(frozen=True)
    class NeedsScale(BaseHparams):
        scale: float

    class Scaled(REGISTRY["fedavg"]):
        """Scaled averaging, for this test."""

        name = "scaled-avg"
        Hparams = NeedsScale

    monkeypatch.setitem(REGISTRY, Scaled.name, Scaled)
    assert main(["show", Scaled.name]) == 0
    out = capsys.readouterr().out
    assert "[registered]" in out and "Scaled averaging, for this test." in out
    assert "algo.scale" in out and "(required)" in out
