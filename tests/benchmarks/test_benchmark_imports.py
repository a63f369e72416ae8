"""Benchmarks import no other benchmark script, only the shared module of their own folder;
the shared modules import none. Every script lives in a folder by kind, listed in
``benchmarks/README.md``.

A benchmark script runs with its folder first on ``sys.path``, so ``import throughput``
inside one would silently tie two scripts together (an import circle, duplicated loops).
Every import is walked, lazy ones inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
#: what several scripts of one folder share: the FedAvg setting and loop, the official
#: FedProto score
SHARED = {"speed/fedavg_bench", "fidelity/fedproto_official"}
#: the folders by kind (benchmarks/README.md)
KINDS = {"speed", "memory", "results", "fidelity", "tools", "gpu"}


def _imported_modules(path: Path) -> set[str]:
    """The top-level names of every module ``path`` imports (absolute imports)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_benchmarks_import_only_the_shared_modules():
    scripts = {path.stem: path for path in BENCHMARKS.rglob("*.py")}
    assert len(scripts) == len(list(BENCHMARKS.rglob("*.py"))), "two scripts share a name"
    shared = {name.split("/")[1] for name in SHARED}
    assert shared <= set(scripts) and "throughput" in scripts
    for name, path in scripts.items():
        folder = path.parent.relative_to(BENCHMARKS).as_posix()
        others = _imported_modules(path) & (set(scripts) - {name})
        allowed = {s.split("/")[1] for s in SHARED if s.startswith(f"{folder}/")}
        allowed = set() if name in shared else allowed
        assert others <= allowed, (
            f"benchmarks/{folder}/{path.name} imports {sorted(others - allowed)}"
        )


def test_every_script_sits_in_a_folder_by_kind_and_in_the_index():
    index = (BENCHMARKS / "README.md").read_text()
    for path in BENCHMARKS.rglob("*"):
        if path.is_dir() or "__pycache__" in path.parts or path.name == "README.md":
            continue
        folder = path.parent.relative_to(BENCHMARKS).as_posix()
        assert folder in KINDS, f"benchmarks/{path.relative_to(BENCHMARKS)} is not in a kind folder"
        assert f"`{path.name}`" in index, f"benchmarks/README.md does not list {path.name}"


def test_the_check_sees_lazy_imports(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("def f():\n    from throughput import main\n    import fedavg_bench.x\n")
    assert _imported_modules(script) == {"throughput", "fedavg_bench"}
