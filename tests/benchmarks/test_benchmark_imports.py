"""Benchmarks import no other benchmark script, only the shared modules; they import none.

Benchmark scripts run with ``benchmarks/`` first on ``sys.path``, so ``import throughput``
inside one would silently tie two scripts together (an import circle, duplicated loops).
Every import is walked, lazy ones inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
#: what several scripts share: the FedAvg setting and loop, the official FedProto score
SHARED = {"fedavg_bench", "fedproto_official"}


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
    scripts = {path.stem: path for path in BENCHMARKS.glob("*.py")}
    assert SHARED <= set(scripts) and "throughput" in scripts
    for name, path in scripts.items():
        others = _imported_modules(path) & (set(scripts) - {name})
        allowed = set() if name in SHARED else SHARED
        assert others <= allowed, f"benchmarks/{path.name} imports {sorted(others - allowed)}"


def test_the_check_sees_lazy_imports(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("def f():\n    from throughput import main\n    import fedavg_bench.x\n")
    assert _imported_modules(script) == {"throughput", "fedavg_bench"}
