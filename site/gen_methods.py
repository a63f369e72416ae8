"""Generate one page per registered algorithm (run by mkdocs-gen-files at build time).

Everything on these pages comes from the registry and the docstrings, so the docs cannot
drift from the code: paper, what a client shares, problems, protocols, hyperparameters with
their defaults, paper symbols, meanings and ranges (``describe_hparams``), and the class
docstring with its deviation notes.
"""

from __future__ import annotations

import dataclasses

import mkdocs_gen_files

from fedshift.algorithms import REGISTRY
from fedshift.core.hparams import describe_hparams
from fedshift.scenarios import PROTOCOLS


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def hparam_rows(cls) -> list[str]:
    """One table row per hyperparameter, read from its ``hp()`` declaration."""
    rows = []
    for info in describe_hparams(cls.Hparams):
        default = "" if info.default is dataclasses.MISSING else info.default
        meaning = f"{info.meaning} ({info.range_text})" if info.range_text else info.meaning
        search = _cell(info.search_text) if info.search_text else ""
        rows.append(
            f"| `algo.{info.name}` | `{_cell(default)}` | {_cell(info.symbol)} | {_cell(meaning)} "
            f"| {search} |"
        )
    return rows


def method_page(name: str, cls) -> str:
    shares = (
        "nothing (pooled data, not federated)"
        if cls.pooled
        else ", ".join(f"`{key}` ({kind.value})" for key, kind in cls.shares.items()) or "nothing"
    )
    protocols = ", ".join(f"`{p}`" for p in (cls.protocols or tuple(PROTOCOLS)))
    lines = [
        f"# {name}",
        "",
        f"**Paper:** {cls.paper}",
        "",
        "| | |",
        "|---|---|",
        f"| shares | {shares} |",
        f"| problems | {', '.join(cls.problems)} |",
        f"| protocols | {protocols} |",
        f"| default model | `{cls.default_model or 'the run default (cnn)'}` |",
        f"| personal models | {'yes' if cls.personal else 'no'} |",
        "",
        f"Run it: `fedshift run -a {name}`; list its hyperparameters: `fedshift show {name}`.",
        "",
    ]
    rows = hparam_rows(cls)
    if rows:
        lines += [
            "## Hyperparameters",
            "",
            "| key | default | symbol | meaning | `sweep --random` draws from |",
            "|---|---|---|---|---|",
            *rows,
            "",
        ]
    lines += [
        "## Implementation and deviations",
        "",
        f"::: {cls.__module__}.{cls.__qualname__}",
        "",
    ]
    return "\n".join(lines)


def index_page() -> str:
    lines = [
        "# Methods",
        "",
        "Generated from `fedshift.algorithms.REGISTRY`; each page shows the class docstring, "
        "whose *Deviation note* paragraphs list where fedshift differs from the paper or the "
        "official code.",
        "",
        "| method | shares | paper |",
        "|---|---|---|",
    ]
    for name, cls in REGISTRY.items():
        shares = "pooled" if cls.pooled else ", ".join(cls.shares) or "nothing"
        lines.append(f"| [{name}]({name}.md) | {_cell(shares)} | {_cell(cls.paper)} |")
    return "\n".join(lines) + "\n"


with mkdocs_gen_files.open("methods/index.md", "w") as handle:
    handle.write(index_page())
for algo_name, algo_cls in REGISTRY.items():
    with mkdocs_gen_files.open(f"methods/{algo_name}.md", "w") as handle:
        handle.write(method_page(algo_name, algo_cls))
