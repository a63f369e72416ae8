"""Generate one page per registered algorithm (run by mkdocs-gen-files at build time).

Everything on these pages comes from :func:`fedshift.algorithms.description.describe_algorithm`,
the reader ``fedshift show`` and ``fedshift list`` print too, so the docs cannot drift from the
code: paper, what a client shares, problems, protocols, hyperparameters with their defaults,
paper symbols, meanings and ranges, and the class docstring with its deviation notes.
"""

from __future__ import annotations

import dataclasses

import mkdocs_gen_files

from fedshift.algorithms import REGISTRY
from fedshift.algorithms.description import AlgorithmDescription, describe_algorithm


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def hparam_rows(about: AlgorithmDescription) -> list[str]:
    """One table row per hyperparameter, read from its ``hp()`` declaration."""
    rows = []
    for info in about.hparams:
        default = "" if info.default is dataclasses.MISSING else info.default
        meaning = f"{info.meaning} ({info.range_text})" if info.range_text else info.meaning
        search = _cell(info.search_text) if info.search_text else ""
        rows.append(
            f"| `algo.{info.name}` | `{_cell(default)}` | {_cell(info.symbol)} | {_cell(meaning)} "
            f"| {search} |"
        )
    return rows


def method_page(about: AlgorithmDescription) -> str:
    shares = (
        about.shares_text()
        if about.pooled
        else ", ".join(f"`{key}` ({kind})" for key, kind in about.shares.items()) or "nothing"
    )
    protocols = ", ".join(f"`{p}`" for p in about.protocols)
    model = (
        about.default_model
        if about.names_default_model
        else f"the run default ({about.default_model})"
    )
    lines = [
        f"# {about.name}",
        "",
        f"**Paper:** {about.paper}",
        "",
        "| | |",
        "|---|---|",
        f"| shares | {shares} |",
        f"| problems | {', '.join(about.problems)} |",
        f"| protocols | {protocols} |",
        f"| default model | `{model}` |",
        f"| personal models | {'yes' if about.personal else 'no'} |",
        "",
        f"Run it: `fedshift run -a {about.name}`; list its hyperparameters: "
        f"`fedshift show {about.name}`.",
        "",
    ]
    rows = hparam_rows(about)
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
        f"::: {about.qualname}",
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
    for name in REGISTRY:
        about = describe_algorithm(name)
        shares = "pooled" if about.pooled else ", ".join(about.shares) or "nothing"
        lines.append(f"| [{name}]({name}.md) | {_cell(shares)} | {_cell(about.paper)} |")
    return "\n".join(lines) + "\n"


with mkdocs_gen_files.open("methods/index.md", "w") as handle:
    handle.write(index_page())
for algo_name in REGISTRY:
    with mkdocs_gen_files.open(f"methods/{algo_name}.md", "w") as handle:
        handle.write(method_page(describe_algorithm(algo_name)))
