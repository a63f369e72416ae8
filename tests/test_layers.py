"""The package's layers point one way: core <- presets, data, models, eval <- scenarios <-
pretrain <- algorithms <- config <- engine <- sweeps <- report <- cli, and so do the rooms
inside engine/ (:data:`ENGINE_RANKS`). Every import statement counts, including imports inside
functions, so a lazy import cannot hide a back-arrow or a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import fedshift

PACKAGE = Path(fedshift.__file__).parent
#: rank of each top-level part of the package; a part may import only lower ranks (and itself)
RANKS = {
    "core": 0,
    "plugins": 0.5,  # entry points and import paths; needs only core
    "presets": 0.5,  # the paper presets' TOML files and their reader; needs only core
    "data": 1,
    "models": 1,
    "eval": 1,
    "scenarios": 1.5,  # one Protocol record per protocol; needs core and data
    "pretrain": 2,
    "algorithms": 3,
    "config": 4,
    "engine": 5,
    "sweeps": 5.5,  # many runs of the engine (not "sweep": fedshift.sweep() is the API)
    "report": 6,
    "cli": 7,
    "api": 7,  # the public Python API, beside the CLI
    "__init__": 8,
    "__main__": 8,
}


#: rank of each room inside ``engine/`` (a module or a subpackage); a room may import only
#: lower ranks (and itself): the engines and the runner look down on evaluation and the
#: federation base; the runner drives the simulation engine; Flower's ServerApp drives the runner
ENGINE_RANKS = {
    "__init__": 0,
    "fault_names": 0,  # one fault vocabulary for both engines
    "compute": 0,  # device, threads, precision, layout, compile
    "assembly": 1,  # config -> experiment
    "evaluation": 2,  # scores of a round, for the runner and both engines' client scoring
    "federation": 3,  # BaseFederation, every engine's
    "simulation": 4,
    "run": 5,  # the round loop, run directory, selection, tracking
    "flower": 6,  # its ServerApp calls the runner
}


#: rank of each room inside ``models/``: the architectures stand on FedModel; the weight
#: sources on the architectures (timm's module, the heads' names); a card names a builder and
#: its pinned weights; weights.py reads any source's file for a card; the registry builds
MODEL_RANKS = {
    "base": 0,  # FedModel, input normalization
    "extras": 0,  # the optional packages (timm), named without importing them
    "alexnet": 1,
    "cnn": 1,
    "resnet": 1,
    "unet": 1,
    "timm_backbones": 1,
    "sources": 2,  # one record per kind of weight source
    "cards": 3,  # one card per backbone
    "weights": 4,  # reading and loading any weight file
    "registry": 5,  # register_model, build_model
    "adain": 5,  # CCST's style-transfer networks, read as any weight file
    "__init__": 6,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """Every ``fedshift...`` module that ``path`` imports, anywhere in the file."""
    found: set[str] = set()
    package = (
        module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    )
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.update(f"{target}.{alias.name}" for alias in node.names)
    return {m for m in found if m == "fedshift" or m.startswith("fedshift.")}


def existing(module: str, modules: set[str]) -> str | None:
    """The longest real module that ``module`` names (``a.b.Name`` -> ``a.b``; ``from a
    import b`` is recorded as ``a.b`` and so names module ``a.b`` when there is one)."""
    while module and module not in modules:
        module = module.rpartition(".")[0]
    return module or None


def part(module: str) -> str:
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


def engine_room(module: str) -> str | None:
    """The room of ``engine/`` that ``module`` lies in (None outside ``engine/``)."""
    pieces = module.split(".")
    if len(pieces) < 2 or pieces[1] != "engine":
        return None
    return pieces[2] if len(pieces) > 2 else "__init__"


def room(module: str, package: str) -> str | None:
    """The room of ``fedshift.<package>`` that ``module`` lies in (None outside it)."""
    pieces = module.split(".")
    if len(pieces) < 2 or pieces[1] != package:
        return None
    return pieces[2] if len(pieces) > 2 else "__init__"


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        targets = {existing(m, set(files)) for m in imported_modules(path)}
        graph[name] = {t for t in targets if t and t != name}
    return graph


def test_every_part_has_a_rank():
    parts = {part(m) for m in import_graph()}
    assert parts <= set(RANKS), f"give these parts a rank: {sorted(parts - set(RANKS))}"


def test_no_import_points_up_a_layer():
    back = [
        f"{src} -> {dst}"
        for src, targets in import_graph().items()
        for dst in targets
        if RANKS[part(dst)] > RANKS[part(src)]
        or (RANKS[part(dst)] == RANKS[part(src)] and part(dst) != part(src))
    ]
    assert not back, "imports against the layers:\n" + "\n".join(sorted(back))


def test_every_engine_room_has_a_rank():
    rooms = {engine_room(m) for m in import_graph()} - {None}
    assert rooms <= set(ENGINE_RANKS), (
        f"give these rooms a rank: {sorted(rooms - set(ENGINE_RANKS))}"
    )


def test_no_import_points_up_inside_engine():
    back = [
        f"{src} -> {dst}"
        for src, targets in import_graph().items()
        for dst in targets
        if (here := engine_room(src)) is not None
        and (there := engine_room(dst)) is not None
        and here != there
        and ENGINE_RANKS[there] >= ENGINE_RANKS[here]
    ]
    assert not back, "imports against the rooms of engine/:\n" + "\n".join(sorted(back))


def test_every_models_room_has_a_rank():
    rooms = {room(m, "models") for m in import_graph()} - {None}
    assert rooms <= set(MODEL_RANKS), f"give these rooms a rank: {sorted(rooms - set(MODEL_RANKS))}"


def test_no_import_points_up_inside_models():
    back = [
        f"{src} -> {dst}"
        for src, targets in import_graph().items()
        for dst in targets
        if (here := room(src, "models")) is not None
        and (there := room(dst, "models")) is not None
        and here != there
        and MODEL_RANKS[there] >= MODEL_RANKS[here]
    ]
    assert not back, "imports against the rooms of models/:\n" + "\n".join(sorted(back))


def test_no_import_cycle():
    graph = import_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_checker_sees_a_back_arrow(tmp_path):
    """The walker finds imports inside functions and resolves relative ones."""
    nested = tmp_path / "fedshift" / "core" / "x.py"
    nested.parent.mkdir(parents=True)
    nested.write_text("def f():\n    from ..engine import runner\n    import fedshift.cli\n")
    global PACKAGE
    saved, PACKAGE = PACKAGE, tmp_path / "fedshift"
    try:
        assert imported_modules(nested) == {"fedshift.engine.runner", "fedshift.cli"}
    finally:
        PACKAGE = saved
