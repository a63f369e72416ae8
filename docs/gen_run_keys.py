"""Generate the run-keys page (run by mkdocs-gen-files at build time): every run key by
section with its type, default, range, ``sweep --random`` distribution, resume rule and
meaning, read from its declaration by :func:`fedshift.core.runconfig.describe_run_keys`,
the reader ``fedshift show run`` prints, so the page cannot drift from the code.
"""

from __future__ import annotations

import mkdocs_gen_files

from fedshift.core.runconfig import SECTIONS, describe_run_keys


def _cell(value: object) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def run_keys_page() -> str:
    infos = describe_run_keys()
    lines = [
        "# Run keys",
        "",
        "Every key a run takes, as `--set KEY=VALUE`, a top-level key of a `--config` TOML file "
        "or a preset; generated from the declarations in `fedshift.core.runconfig.RunConfig` "
        "(the same table: `fedshift show run`). *resume* says what `--resume` may do with a "
        "key: `fixed` (must stay), `may-change`, `may-grow` (more rounds extend a run).",
        "",
    ]
    for group, about in SECTIONS.items():
        lines += [
            f"## {group}",
            "",
            f"{about[0].upper()}{about[1:]}.",
            "",
            "| key | type | default | range | `sweep --random` | resume | meaning |",
            "|---|---|---|---|---|---|---|",
        ]
        for info in infos:
            if info.group != group:
                continue
            meaning = " ".join(part for part in (info.symbol, info.meaning) if part)
            lines.append(
                f"| `{info.name}` | {_cell(info.type_text)} | `{_cell(repr(info.default))}` "
                f"| {_cell(info.range_text)} | {_cell(info.search_text)} | {info.resume} "
                f"| {_cell(meaning)} |"
            )
        lines.append("")
    return "\n".join(lines)


with mkdocs_gen_files.open("run-keys.md", "w") as handle:
    handle.write(run_keys_page())
