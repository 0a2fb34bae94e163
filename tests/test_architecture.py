"""The package's shape, read from its source (parsed, never imported): no import cycle, the store's parts import
downward, the core imports no adapter, and no module, class, function or Lua script outgrows its limit.

An import counts wherever it is written, inside a function too (a cycle through one is still a cycle when that
function runs), but not under ``if TYPE_CHECKING:``; importing ``pkg.sub`` first imports ``pkg`` (its
``__init__``), which counts too unless the importer is inside ``pkg`` (then ``pkg`` is already being imported).
"""

from __future__ import annotations

import ast
import itertools
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "delay_broker"

MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 500
MAX_FUNCTION_LINES = 60
MAX_LUA_LINES = 250
MAX_COMPLEXITY = 15

STORE_ORDER: list[set[str]] = [
    {"options", "replies"},
    {"encoding"},
    {"shards"},
    {"replication", "migration"},
    {"runner"},
    {"far_view"},
    {"parking", "packs", "registry", "dead_letters", "promotion", "stats"},
    {"reading", "check_read", "batching"},
    {"sweeping", "check_findings"},
    {"tiers", "checking"},
    {"parts"},
    {"facade"},
    {"__init__"},
]
"""The modules of ``delay_broker/store/`` from the bottom up: each imports only modules of earlier ranks, never
one of its own rank or a later one (docs/architecture.md, "The store, part by part")."""

ADAPTERS = ("delay_broker.celery", "delay_broker.dramatiq")
FRAMEWORKS = ("celery", "kombu", "dramatiq", "dramatiq_sqs")
NOT_CORE = (*ADAPTERS, "delay_broker.cli", "delay_broker.demo", "delay_broker.__main__")
"""The adapters, and the applications built on them (the command, the demo): everything else is the core, which
must work with neither framework installed."""


@dataclass
class Graph:
    """The modules of a package and, for each, the package's modules that importing it imports (with the line)."""

    files: dict[str, Path]
    edges: dict[str, dict[str, int]] = field(default_factory=dict)
    external: dict[str, dict[str, int]] = field(default_factory=dict)
    """Top-level names of other packages each module imports (``celery``, ``redis`` ...)."""


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_package(graph: Graph, name: str) -> bool:
    return graph.files[name].name == "__init__.py"


def import_graph(root: Path) -> Graph:
    graph = Graph({module_name(path, root): path for path in sorted(root.rglob("*.py"))})
    for name, path in graph.files.items():
        edges = graph.edges.setdefault(name, {})
        external = graph.external.setdefault(name, {})
        for target, line in imported(graph, name, ast.parse(path.read_text(), str(path))):
            if target in graph.files:
                edges.setdefault(target, line)
            else:
                external.setdefault(target.partition(".")[0], line)
        for target, line in list(edges.items()):
            # Importing a.b.c imports a and a.b first: edges too, unless the importer is inside them.
            parts = target.split(".")
            for end in range(1, len(parts)):
                parent = ".".join(parts[:end])
                if parent in graph.files and not name.startswith(parent + ".") and parent != name:
                    edges.setdefault(parent, line)
        edges.pop(name, None)
    return graph


def imported(graph: Graph, name: str, tree: ast.Module) -> Iterator[tuple[str, int]]:
    """What each import statement of the module names: a module of the package when it is one, else the
    dotted name as written (another package)."""
    for node in statements(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = resolve(graph, name, node.level, node.module)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield (submodule if submodule in graph.files else base), node.lineno


def statements(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of the tree except those under ``if TYPE_CHECKING:`` (its ``else`` runs, so it counts)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for child in node.orelse:
                yield child
                yield from statements(child)
            continue
        yield node
        yield from statements(node)


def resolve(graph: Graph, name: str, level: int, module: str | None) -> str:
    if not level:
        return module or ""
    package = name.split(".") if is_package(graph, name) else name.split(".")[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join([*base, module] if module else base)


def cycles(graph: Graph) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan's algorithm), as the path it takes."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph.edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(path_within(graph, node, group))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph.files)))
    try:
        for node in sorted(graph.edges):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return found


def path_within(graph: Graph, start: str, group: set[str]) -> list[str]:
    """The shortest way from ``start`` back to itself through ``group`` (breadth first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph.edges[node]):
                if target == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if target in group and target not in came_from:
                    came_from[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover - Tarjan's group always has one


def described(graph: Graph, cycle: list[str]) -> str:
    steps = [f"{a} (line {graph.edges[a][b]})" for a, b in itertools.pairwise(cycle)]
    return " -> ".join([*steps, cycle[-1]])


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph(PACKAGE)


# -- (a) no import cycle ------------------------------------------------------------------------------------------


def test_no_import_cycle_in_delay_broker(graph: Graph) -> None:
    found = [described(graph, cycle) for cycle in cycles(graph)]
    assert not found, "import cycles (module, line of the import that leads on):\n" + "\n".join(found)


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "pkg"


def test_the_cycle_finder_sees_imports_in_functions_and_package_inits_but_not_type_checking(tmp_path: Path) -> None:
    """The checker above, on small trees: it would be no check if it missed the cycles it is meant to find."""
    function_level = write_tree(
        tmp_path / "a",
        {
            "pkg/__init__.py": "",
            "pkg/one.py": "from .two import x\n",
            "pkg/two.py": "def f():\n    from . import one\n",
        },
    )
    assert cycles(import_graph(function_level)) == [["pkg.one", "pkg.two", "pkg.one"]]
    through_init = write_tree(
        tmp_path / "b",
        {
            "pkg/__init__.py": "from .sub.low import thing\n",
            "pkg/sub/__init__.py": "from pkg.high import other\n",
            "pkg/sub/low.py": "",
            "pkg/high.py": "",
        },
    )
    graph = import_graph(through_init)
    assert not cycles(graph), "pkg/__init__ is being imported when pkg.sub imports pkg.high"
    assert "pkg.sub" in graph.edges["pkg"], "importing pkg.sub.low imports pkg.sub first"
    upward = write_tree(
        tmp_path / "c",
        {
            "pkg/__init__.py": "",
            "pkg/sub/__init__.py": "from .low import x\n",
            "pkg/sub/low.py": "",
            "pkg/other.py": "import pkg.sub.low\n",
            "pkg/sub/back.py": "from ..other import y\n",
        },
    )
    graph = import_graph(upward)
    assert graph.edges["pkg.other"].keys() == {"pkg.sub.low", "pkg.sub"}
    assert graph.edges["pkg.sub.back"].keys() == {"pkg.other"}
    type_checking = write_tree(
        tmp_path / "d",
        {
            "pkg/__init__.py": "",
            "pkg/one.py": "from typing import TYPE_CHECKING\nfrom .two import x\n",
            "pkg/two.py": (
                "import typing\nif typing.TYPE_CHECKING:\n    from .one import y\nelse:\n    from . import three\n"
            ),
            "pkg/three.py": "from pkg import one\n",
        },
    )
    graph = import_graph(type_checking)
    assert "pkg.one" not in graph.edges["pkg.two"], "an import for type checkers only is no import"
    assert cycles(graph) == [["pkg.one", "pkg.two", "pkg.three", "pkg.one"]], "the else branch runs"


# -- (b) the store imports downward -------------------------------------------------------------------------------


def test_the_store_s_modules_import_only_downward(graph: Graph) -> None:
    rank = {module: n for n, modules in enumerate(STORE_ORDER) for module in modules}
    present = {path.stem for path in (PACKAGE / "store").glob("*.py")}
    assert not present - rank.keys(), f"place these store modules in STORE_ORDER: {sorted(present - rank.keys())}"
    assert not rank.keys() - present, f"STORE_ORDER names modules that are gone: {sorted(rank.keys() - present)}"
    wrong = []
    for stem in sorted(present):
        name = "delay_broker.store" + ("" if stem == "__init__" else f".{stem}")
        for target, line in sorted(graph.edges[name].items()):
            if target == "delay_broker.store" or target.startswith("delay_broker.store."):
                target_stem = "__init__" if target == "delay_broker.store" else target.rpartition(".")[2]
                if rank[target_stem] >= rank[stem]:
                    wrong.append(f"store/{stem}.py line {line} imports store/{target_stem}.py (not below it)")
    assert not wrong, "\n".join(wrong)


# -- (c) the core imports no adapter ------------------------------------------------------------------------------


def is_within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == package or name.startswith(package + ".") for package in packages)


def test_the_core_imports_no_adapter_and_no_framework(graph: Graph) -> None:
    core = [name for name in graph.files if not is_within(name, NOT_CORE)]
    assert {"delay_broker.operations", "delay_broker.promoter", "delay_broker.store.facade"} <= set(core)
    wrong = [
        f"{name} (line {line}) imports {target}"
        for name in sorted(core)
        for target, line in sorted(graph.edges[name].items())
        if is_within(target, ADAPTERS)
    ]
    wrong += [
        f"{name} (line {line}) imports {package}"
        for name in sorted(core)
        for package, line in sorted(graph.external[name].items())
        if package in FRAMEWORKS
    ]
    assert not wrong, "the core must not depend on an adapter or its framework:\n" + "\n".join(wrong)


# -- (d) sizes ------------------------------------------------------------------------------------------------------


def test_no_module_class_or_function_outgrows_its_limit() -> None:
    too_big = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(ROOT)
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            too_big.append(f"{where}: {len(text.splitlines())} lines (module limit {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text, str(path))):
            if not isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            kind, limit = "function", MAX_FUNCTION_LINES
            if isinstance(node, ast.ClassDef):
                kind, limit = "class", MAX_CLASS_LINES
            if lines > limit:
                too_big.append(f"{where}:{node.lineno} {kind} {node.name}: {lines} lines ({kind} limit {limit})")
    assert not too_big, "\n".join(too_big)


def test_no_lua_script_outgrows_its_limit() -> None:
    scripts = sorted(PACKAGE.rglob("*.lua"))
    assert any(path.parent.name == "_lib" for path in scripts), "the helpers are found too"
    too_big = [
        f"{path.relative_to(ROOT)}: {lines} lines (limit {MAX_LUA_LINES})"
        for path in scripts
        if (lines := len(path.read_text().splitlines())) > MAX_LUA_LINES
    ]
    assert not too_big, "\n".join(too_big)


def test_ruff_checks_complexity_at_15() -> None:
    """ruff (scripts/test runs it) enforces the complexity; this keeps the setting from being dropped."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10 has no tomllib; the test extra does not bring tomli
        tomllib = pytest.importorskip("tomli")
    lint = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert "C90" in lint["select"], f"ruff's select lacks C90: {lint['select']}"
    assert lint["mccabe"]["max-complexity"] == MAX_COMPLEXITY, lint["mccabe"]
