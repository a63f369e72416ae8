"""One reader of an algorithm's description: ``fedshift show``, ``fedshift list algorithms``
and the generated method pages (docs/gen_methods.py) say the same problems and shares."""

from __future__ import annotations

import pytest
from helpers import run_docs_script

from fedshift.algorithms import REGISTRY
from fedshift.algorithms.description import describe_algorithm
from fedshift.cli import main


@pytest.fixture(scope="module")
def method_pages(tmp_path_factory) -> dict[str, str]:
    """The method pages docs/gen_methods.py writes."""
    out = tmp_path_factory.mktemp("methods")
    (out / "methods").mkdir()
    run_docs_script("gen_methods.py", out)
    return {p.stem: p.read_text() for p in (out / "methods").glob("*.md")}


def page_problems(page: str) -> str:
    return next(line for line in page.splitlines() if line.startswith("| problems |"))


@pytest.mark.parametrize("name", ["ccst", "fedga"])
def test_a_subclass_with_its_own_tasks_is_classification_only_everywhere(
    name, method_pages, capsys
):
    """CCST and FedGA derive from FedAvg but train with their own client tasks: the run
    refuses segmentation, and so must the page (it once copied FedAvg's problems)."""
    assert describe_algorithm(name).problems == ("classification",)
    assert page_problems(method_pages[name]) == "| problems | classification |"
    assert main(["show", name]) == 0
    assert "problems:   classification\n" in capsys.readouterr().out


def test_every_page_says_what_show_says(method_pages, capsys):
    assert set(method_pages) == {*REGISTRY, "index"}
    for name in REGISTRY:
        about = describe_algorithm(name)
        assert page_problems(method_pages[name]) == f"| problems | {', '.join(about.problems)} |"
        main(["show", name])
        shown = capsys.readouterr().out
        assert f"problems:   {', '.join(about.problems)}\n" in shown
        assert f"shares:     {about.shares_text()}\n" in shown
