"""The package's structure, as docs/architecture.md describes it: the engine needs no Airflow
(Spark executors and activated readers import it where Airflow must not be imported), its
imports point down its layers, the import graph of the package and of the benchmark (bench/)
has no cycle, between modules or between the folders and the modules beside them, and no
module grows past a size a reader can hold in mind. The benchmark's scenarios register
themselves: its harness imports none of them."""

from __future__ import annotations

import ast
import functools
import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "airflow_broker"
BENCH = PACKAGE.parent / "bench"
# Installed inside airflow_broker; each imports Airflow.
AIRFLOW_FOLDERS = ("hooks", "operators", "sensors", "triggers", "notifications", "queues")
# Not engine: the demo's Airflow DAG lives with the demo; the UI plugin runs in Airflow's
# api-server only.
NOT_ENGINE = (*AIRFLOW_FOLDERS, "demos", "ui")
# The command line runs the demo and registers the pages' permissions in FAB (lazily: the
# engine's commands never load them).
MAY_IMPORT = {"airflow_broker.cli": ("demos", "ui")}
# Modules allowed past MAX_LINES, and why.
LONG_MODULES = {
    "airflow_broker.errors": "one class per SQL Server error number: a table, read by number",
}
MAX_LINES = 420
# The engine's layers, lowest first (docs/architecture.md, "Layers"): a module imports from its
# own layer and those below, never from one above. An entry is a module beside the folders or
# a whole folder; "__init__" is the package's own, the public API.
ENGINE_LAYERS: tuple[tuple[str, ...], ...] = (
    # What the statements build on; none of it runs a broker statement.
    ("errors", "messages", "validation", "events", "callables", "redaction", "reconnect",
     "queries", "migrations", "embedded", "waitfor"),
    # The runner, and what the Transactions of one Broker share.
    ("_statements",),
    # The statements.
    ("catalog", "permissions", "dialogs", "receive"),
    ("transaction",),
    # Poison messages, one layer: the statements reach it through _statements.ReceiveRecorder,
    # and it acts in the Transaction it is given, never through a Broker.
    ("poison",),
    ("broker", "__init__"),
    # What runs on a Broker.
    ("readers", "worker", "admin", "spark"),
    ("cli", "get_provider_info"),
)


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> Iterator[tuple[str, Path]]:
    # The Airflow folders are linked into the package: walk through the links.
    found = [Path(folder) / name for folder, _, names in os.walk(PACKAGE, followlinks=True)
             for name in names if name.endswith(".py")]
    for path in sorted(found):
        yield _module_name(path), path


def project_modules() -> Iterator[tuple[str, Path]]:
    """The package's modules and the benchmark's."""
    yield from modules()
    for path in sorted(BENCH.glob("*.py")):
        yield _module_name(path), path


@functools.cache
def known_modules() -> frozenset[str]:
    return frozenset(name for name, _ in project_modules())


def imports(name: str, path: Path) -> Iterator[str]:
    """Every module ``name`` imports: at module level, inside a function, or for type checking
    only (a cycle of types is a cycle of meaning all the same)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    known = known_modules()

    def visit(node: ast.AST) -> Iterator[str]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                yield from (alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                names = [f"{base}.{alias.name}" for alias in child.names]
                # "from package import module" imports the module; the package comes with it
                # by Python's rules, not by a choice of the importing module's.
                if not all(imported in known for imported in names):
                    yield base
                yield from names
            else:
                yield from visit(child)

    yield from visit(ast.parse(path.read_text(), str(path)))


def graph() -> dict[str, set[str]]:
    known = dict(project_modules())
    return {name: {m for m in imports(name, path) if m in known and m != name}
            for name, path in known.items()}


def test_the_engine_never_imports_airflow() -> None:
    """Airflow 3's task supervisor forbids its metadata database to a task's children, and a
    Spark executor has no Airflow at all: whatever they import must not import Airflow."""
    offenders = []
    for name, path in modules():
        if name.split(".")[1:2] and name.split(".")[1] in NOT_ENGINE:
            continue
        for imported in imports(name, path):
            top = imported.split(".")
            if top[0] == "airflow_broker" and top[1:2] and top[1] in MAY_IMPORT.get(name, ()):
                continue
            if top[0] == "airflow" or (top[0] == "airflow_broker" and top[1:2]
                                       and top[1] in NOT_ENGINE):
                offenders.append(f"{name} imports {imported}")
    assert offenders == []


def unit(name: str) -> str:
    """The entry of ENGINE_LAYERS a module belongs to: its folder, or itself beside them (a
    module of bench/ is a unit of its own)."""
    parts = name.split(".")
    if parts[0] != "airflow_broker":
        return name
    return parts[1] if len(parts) > 1 else "__init__"


def unit_graph() -> dict[str, set[str]]:
    """The import graph between the package's folders and the modules beside them."""
    edges: dict[str, set[str]] = {}
    for name, imported in graph().items():
        edges.setdefault(unit(name), set()).update(
            unit(m) for m in imported if unit(m) != unit(name))
    return edges


def cycles_of(edges: dict[str, set[str]]) -> list[list[str]]:
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            # A package's __init__ re-exporting its own modules is no cycle: importing the
            # module imports the package first, by Python's rules, not by a choice of ours.
            if node.startswith(nxt + "."):
                continue
            if state.get(nxt) == 1:
                cycles.append([*path[path.index(nxt):], nxt])
            elif nxt not in state:
                walk(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            walk(node)
    return cycles


def test_the_import_graph_has_no_cycle() -> None:
    assert cycles_of(graph()) == []


def test_the_folders_and_the_modules_beside_them_have_no_cycle() -> None:
    """A folder that imports a module beside it which imports the folder back is two halves of
    one layer: each can only be understood with the other."""
    assert cycles_of(unit_graph()) == []


def test_every_engine_module_has_a_layer() -> None:
    layered = [u for layer in ENGINE_LAYERS for u in layer]
    assert len(layered) == len(set(layered))
    engine = {unit(name) for name, _ in modules()} - set(NOT_ENGINE)
    assert engine == set(layered)


def test_the_engines_imports_point_down_its_layers() -> None:
    level = {u: i for i, layer in enumerate(ENGINE_LAYERS) for u in layer}
    upward = [f"{name} imports {m}" for name, imported in graph().items()
              if unit(name) in level
              for m in sorted(imported) if level.get(unit(m), -1) > level[unit(name)]]
    assert upward == []


def test_poison_imports_neither_the_broker_nor_the_readers() -> None:
    """poison/ sits between Transaction and Broker: its quarantine and parking act in the
    transaction they are given, and RECEIVE reaches its recording without importing it."""
    above = ("airflow_broker.broker", "airflow_broker.readers", "airflow_broker.worker",
             "airflow_broker.spark", "airflow_broker.admin", "airflow_broker.cli")
    found = [f"{name} imports {m}" for name, imported in graph().items()
             if unit(name) == "poison"
             for m in sorted(imported) if m.startswith(above)]
    assert found == []
    assert not [name for name, imported in graph().items()
                if unit(name) in ("_statements", "catalog", "permissions", "dialogs", "receive",
                                  "transaction")
                and any(unit(m) == "poison" for m in imported)]


def _registers_a_scenario(path: Path) -> bool:
    """Whether a module registers a scenario of the benchmark (``@register(...)``)."""
    return any(isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
               and node.func.id == "register"
               for node in ast.walk(ast.parse(path.read_text(), str(path))))


def test_the_bench_harness_imports_no_scenario() -> None:
    """The scenarios register themselves (bench.scenario), bench.suite names them; the harness
    runs what is registered and imports no scenario, and no scenario imports the harness."""
    edges = graph()
    scenarios = {name for name, path in project_modules()
                 if name.startswith("bench.") and _registers_a_scenario(path)}
    assert len(scenarios) >= 8, sorted(scenarios)
    assert edges["bench.harness"] & scenarios == set()
    assert sorted(name for name in scenarios if "bench.harness" in edges[name]) == []


def test_every_letter_of_the_benchmark_has_one_measurement() -> None:
    import bench.suite  # noqa: F401  (loads the scenario modules, which register themselves)
    from bench.scenario import RUN_ORDER, SCENARIOS, registered

    letters = [letter for measurement in registered() for letter in measurement.letters]
    assert sorted(letters) == sorted(SCENARIOS) == sorted(RUN_ORDER)


def test_every_registration_names_a_callable_of_the_tree() -> None:
    """What the package finds by registration instead of by import (pyproject.toml's entry
    points: Airflow's provider info, route address resolvers) exists where it says; and a
    resolver the engine's transport loads lives outside the engine, which must not import it."""
    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    known = dict(modules())
    for group, entries in project["entry-points"].items():
        for target in entries.values():
            module, _, attribute = target.partition(":")
            assert module in known, (group, target)
            tree = ast.parse(known[module].read_text())
            assert attribute in {n.name for n in tree.body
                                 if isinstance(n, ast.FunctionDef | ast.ClassDef)}, target
            if group == "airflow_broker.route_addresses":
                assert module.split(".")[1] in AIRFLOW_FOLDERS, target


@pytest.mark.parametrize("name", [name for name, _ in modules()])
def test_modules_stay_small(name: str) -> None:
    path = dict(modules())[name]
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES or name in LONG_MODULES, (
        f"{name} has {lines} lines: split it, or say in LONG_MODULES why it is one module")


def test_every_long_module_entry_is_long() -> None:
    """An entry of LONG_MODULES whose module is short again is a stale excuse: remove it."""
    found = dict(modules())
    short = [name for name in LONG_MODULES
             if len(found[name].read_text().splitlines()) <= MAX_LINES]
    assert short == []


def mapped_paths() -> set[str]:
    """The files and folders docs/architecture.md's map names, as paths from the repository's
    root (two spaces of indentation per folder level)."""
    text = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    block = text[text.index("## Map"):]
    block = block[block.index("```\n") + 4:]
    block = block[:block.index("```")]
    paths: set[str] = set()
    folders: list[str] = []
    for line in block.splitlines():
        depth = (len(line) - len(line.lstrip(" "))) // 2
        folders = folders[:depth]
        names = re.split(r"\s{2,}", line.strip())[0].split()
        for name in names:
            paths.add("/".join([*folders, name]).rstrip("/"))
        if len(names) == 1 and names[0].endswith("/"):
            folders.append(names[0].rstrip("/"))
    return paths


def test_the_architecture_map_matches_the_tree() -> None:
    """Every module of the package and of the Airflow folders is on the map, and everything on
    the map exists."""
    root = PACKAGE.parent
    on_map = mapped_paths()
    modules_in_tree = {str(path.relative_to(root)) for _, path in modules()
                       if path.name != "__init__.py" or path.parent == PACKAGE}
    # The Airflow folders appear once, at the top of the repository.
    modules_in_tree = {m.removeprefix("airflow_broker/") if m.split("/")[1] in AIRFLOW_FOLDERS
                       else m for m in modules_in_tree}
    assert modules_in_tree - on_map == set()
    assert {p for p in on_map if not (root / p).exists()} == set()
