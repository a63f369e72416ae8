"""Generate the ``hp()`` / ``key()`` reference page (run by mkdocs-gen-files at build time):
every argument of :func:`fedshift.core.hparams.hp` and :func:`fedshift.core.runconfig.key`
with its default read from the signature, and the search distributions with their
signatures and docstrings. The meanings of the arguments are kept here in ``MEANINGS``;
``tests/core/test_declarations_page.py`` fails when a signature gains an argument this page
does not explain, so the page cannot drift from the code.
"""

from __future__ import annotations

import inspect

import mkdocs_gen_files

from fedshift.core.hparams import hp, integers, log_uniform, one_of, uniform
from fedshift.core.runconfig import RESUME_RULES, SECTIONS, key

#: what each argument of hp() / key() means (every argument of both signatures)
MEANINGS = {
    "default": "the value a run uses unless it sets one: the paper's or the official code's "
    "value for a hyperparameter; it must lie in the declared range (checked when the class "
    "is defined)",
    "symbol": "the paper's symbol (`μ`, `λ`, `η_g`), printed before the meaning by `fedshift "
    "show` and on the method pages; empty where the paper has none",
    "help": "what the value means, one sentence, with the paper's choice where it differs "
    "from the default; `fedshift show`, `--help` and the generated pages print it",
    "low": "the smallest allowed value (closed unless `low_open`); None: no lower bound. A "
    "value outside the range is a ConfigError naming the key and the range",
    "high": "the largest allowed value (closed unless `high_open`); None: no upper bound",
    "low_open": "exclude `low` itself (`> 0` instead of `>= 0`); needs `low`",
    "high_open": "exclude `high` itself (`< 1` instead of `<= 1`); needs `high`",
    "search": "the distribution `fedshift sweep --random N` draws the value from "
    "(`log_uniform`, `uniform`, `integers`, `one_of`, below); None: never drawn. It must stay "
    "inside the range",
    "extra": "further metadata kept on the dataclass field (`key()` stores `group`, "
    "`resume` and `choices` here)",
    "group": "(run keys only) the section the key is listed in: "
    + ", ".join(f"`{name}`" for name in SECTIONS),
    "resume": "(run keys only) what `--resume` may do with the key: "
    + ", ".join(f"`{rule}`" for rule in RESUME_RULES)
    + " (`fixed`: must stay; `may-change`; `may-grow`: more rounds extend a run)",
    "choices": "(run keys only) the registry the value names, as `module:attribute` (e.g. "
    "`fedshift.scenarios:PROTOCOLS`); `{choices}` in `help` (there exactly when this is "
    "given) becomes the registry's names each time the key is described (`fedshift show run`, "
    "`--help`, the run-keys page), so the help lists every entry, later ones included",
}


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def argument_rows(function) -> list[str]:
    """One row per argument of ``function``: name, kind, default (from the signature) and
    meaning (from :data:`MEANINGS`)."""
    rows = ["| argument | default | meaning |", "|---|---|---|"]
    for name, param in inspect.signature(function).parameters.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            shown, default = f"**{name}", ""
        elif param.default is inspect.Parameter.empty:
            shown, default = name, "(required)"
        else:
            shown, default = name, f"`{param.default!r}`"
        rows.append(f"| `{shown}` | {_cell(default)} | {_cell(MEANINGS[name])} |")
    return rows


def declarations_page() -> str:
    lines = [
        "# hp() and key(): declaring a knob",
        "",
        "Every algorithm hyperparameter is a field of the algorithm's `Hparams` dataclass "
        "declared with `hp()` (`fedshift.core.hparams`), and every run key a field of "
        "`RunConfig` declared with `key()` (`fedshift.core.runconfig`). One declaration holds "
        "the default, meaning, paper symbol, range and search distribution; `fedshift show`, "
        "`--help`, the method and run-key pages, the range check, `sweep --random` and "
        "`--resume` all read it. Generated from the signatures below.",
        "",
        "```python",
        "@dataclass(frozen=True)",
        "class FedProxHparams(BaseHparams):",
        '    mu: float = hp(0.01, "μ", "weight of the proximal term", low=0,',
        "                   search=log_uniform(1e-3, 1.0))",
        "```",
        "",
        f"## `hp{inspect.signature(hp)}`",
        "",
        inspect.getdoc(hp) or "",
        "",
        *argument_rows(hp),
        "",
        f"## `key{inspect.signature(key)}`",
        "",
        inspect.getdoc(key) or "",
        "",
        *argument_rows(key),
        "",
        "## Search distributions",
        "",
        "| call | meaning |",
        "|---|---|",
    ]
    for function in (log_uniform, uniform, integers, one_of):
        signature = f"{function.__name__}{inspect.signature(function)}"
        lines.append(f"| `{_cell(signature)}` | {_cell(inspect.getdoc(function))} |")
    lines.append("")
    return "\n".join(lines)


with mkdocs_gen_files.open("declarations.md", "w") as handle:
    handle.write(declarations_page())
