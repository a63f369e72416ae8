"""The generated hp()/key() reference page explains every argument of both signatures."""

from __future__ import annotations

import inspect

import pytest
from helpers import run_docs_script

from fedshift.core.hparams import hp
from fedshift.core.runconfig import key


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> str:
    out = run_docs_script("gen_declarations.py", tmp_path_factory.mktemp("docs"))
    return (out / "declarations.md").read_text()


@pytest.mark.parametrize(("name", "function"), [("hp", hp), ("key", key)])
def test_every_argument_has_a_row_with_its_default(page, name, function):
    title = f"## `{name}{inspect.signature(function)}`"
    section = page.split(title, 1)[1].split("\n## ", 1)[0]
    rows = {line.split("`")[1]: line for line in section.splitlines() if line.startswith("| `")}
    for argument, param in inspect.signature(function).parameters.items():
        shown = f"**{argument}" if param.kind is inspect.Parameter.VAR_KEYWORD else argument
        assert shown in rows, argument
        if param.default is not inspect.Parameter.empty:
            assert f"`{param.default!r}`" in rows[shown], argument
        meaning = rows[shown].split(" | ")[-1]
        assert len(meaning) > 20, argument


def test_search_distributions_and_sections_are_listed(page):
    for name in ("log_uniform", "uniform", "integers", "one_of"):
        assert f"| `{name}(" in page
    assert "`training`" in page and "`may-grow`" in page
