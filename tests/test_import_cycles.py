"""The import graphs of ``sqlqueue`` and ``bench`` have no cycles.

Every module is parsed with :mod:`ast`; an import is an edge of the graph wherever it stands,
at the top of the module or inside a function (moving an import into a function hides a cycle
from Python, not from a reader), except under ``if TYPE_CHECKING:``, which annotations alone
read. A relative import is resolved against its package, and ``from package import name`` is an
edge to the submodule when ``name`` is one, else to the package. The parent packages Python
runs on the way to a submodule are not edges: only what a module names.

A cycle is reported as its strongly connected component (every module in it, and one path
round it), so a failure says what to untie. The checker checks itself on a small synthetic
package first, so a parser that silently found no imports would fail here rather than pass.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

import bench
import sqlqueue
from tests._support.source import parse

#: Imports inside functions that load a module only when it is used, each with its reason. They
#: are edges of the graph like any other import (so they cannot hide a cycle); this list only
#: says that their being inside a function is deliberate.
LAZY_ALLOWED: Mapping[str, Mapping[str, str]] = {
    "sqlqueue.webhooks._webhooks": {
        "sqlqueue.webhooks._http": "a receiver verifies signatures without httpx installed",
        "sqlqueue.webhooks._policy": "the sending side loads with the first delivery",
    },
    "sqlqueue._worker.observe": {
        "sqlqueue._worker.prometheus": "prometheus_client loads only with metrics_port",
    },
    "sqlqueue.cli._main": {
        "sqlqueue.cli._run": "SQLAlchemy, the drivers and alembic load only once the command "
        "line is parsed: --version and --help answer without them",
    },
    "sqlqueue.cli._web_cmd": {
        "sqlqueue.web._serve": "Starlette, Jinja2 and uvicorn load only for `sqlqueue web`",
    },
    "sqlqueue.django._tasks_worker": {
        "sqlqueue.django._tasks_framework": "Django's Tasks framework (Django 6 or the "
        "backport) loads only when TASKS names sqlqueue's backend: a project without it runs "
        "`manage.py sqlqueue_worker` as before",
        "sqlqueue.django._tasks_running": "(as _tasks_framework: it imports the framework)",
        "sqlqueue.django.tasks": "(as _tasks_framework: it imports the framework)",
    },
    "bench.mvcc": {
        "bench.peer_worker": "asyncpg loads only when pgqueuer is one of the systems measured",
        "bench.mvcc_report": "matplotlib loads only when the results are saved",
    },
    "bench.mvcc_worker": {
        "bench.peer_worker": "asyncpg loads only in the process that runs pgqueuer",
    },
    "bench.run": {
        "bench.fairness": "its private sqlqueue imports load only for --only fairness, so "
        "`python -m bench compare` runs the drains against revisions without them",
        "bench.mvcc": "its private sqlqueue imports load only for --only mvcc (as fairness)",
    },
}


@dataclass(frozen=True)
class Edge:
    """One import: ``source`` names ``target``; ``lazy`` when it stands inside a function."""

    source: str
    target: str
    lazy: bool


def modules_of(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package in directory ``root``, by dotted name."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = (package, *path.relative_to(root).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(
    node: ast.Import | ast.ImportFrom, module: str, modules: Mapping[str, Path]
) -> set[str]:
    """The modules of ``modules`` one import statement names."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".")
            if modules[module].name != "__init__.py":
                package = package[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, base] if base else package)
        names = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
            for alias in node.names
        ]
    found = set()
    for name in names:
        # `import a.b.c` names a.b.c; the nearest module it reaches is the edge.
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def edges_of(modules: Mapping[str, Path]) -> list[Edge]:
    """Every import between ``modules``, not counting those under ``if TYPE_CHECKING:``."""
    edges: list[Edge] = []

    def visit(node: ast.AST, module: str, *, lazy: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for other in node.orelse:  # only the `else:` branch runs
                visit(other, module, lazy=lazy)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            for target in sorted(_targets(node, module, modules) - {module}):
                edges.append(Edge(module, target, lazy))
        inner = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, module, lazy=lazy or inner)

    for module, path in modules.items():
        visit(parse(path.read_text(), filename=str(path)), module, lazy=False)
    return edges


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative),
    each sorted, the list sorted: every set of modules that import each other round a loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def path_round(component: list[str], graph: Mapping[str, Iterable[str]]) -> list[str]:
    """One loop through ``component``'s first module (breadth-first, so a shortest one)."""
    start = component[0]
    members = set(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, ())):
                if child == start:
                    loop = [node]
                    while loop[-1] != start:
                        loop.append(came_from[loop[-1]])
                    return [*reversed(loop), start]
                if child in members and child not in came_from:
                    came_from[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"{component} is not a cycle")


def graph_of(edges: Iterable[Edge]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
    return graph


def report(graph: Mapping[str, Iterable[str]]) -> list[str]:
    return [" -> ".join(path_round(component, graph)) for component in cycles(graph)]


PACKAGES = {
    "sqlqueue": Path(sqlqueue.__file__).parent,
    "bench": Path(bench.__file__).parent,
}


#: sqlqueue's layers, top first (docs/architecture.md, "Layers"): a module may import its own
#: layer's and those below, never one above. A module is placed by its longest listed prefix,
#: so a new module in a subpackage is placed with it; a new root module must be listed here.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("sqlqueue", "sqlqueue.__main__", "sqlqueue.cli", "sqlqueue.web", "sqlqueue.email",
     "sqlqueue.webhooks", "sqlqueue.testing", "sqlqueue._pytest_plugin", "sqlqueue.asgi",
     "sqlqueue.flask", "sqlqueue.django"),
    ("sqlqueue._queue",),
    ("sqlqueue._worker", "sqlqueue._task", "sqlqueue._enqueue", "sqlqueue._context",
     "sqlqueue._arguments", "sqlqueue._tracing", "sqlqueue._logs", "sqlqueue._operators",
     "sqlqueue._migrate", "sqlqueue._liveness", "sqlqueue._middleware",
     "sqlqueue._enqueue_workflow", "sqlqueue._step_context"),
    ("sqlqueue._store",),
    ("sqlqueue._policies", "sqlqueue._job", "sqlqueue._jobrow", "sqlqueue._batch",
     "sqlqueue._workflow", "sqlqueue._workflow_summary",
     "sqlqueue._job_action", "sqlqueue._worker_info",
     "sqlqueue._payload", "sqlqueue._limits", "sqlqueue._scrub", "sqlqueue._secrets",
     "sqlqueue._secret_keys", "sqlqueue._unique", "sqlqueue._expiry", "sqlqueue._tags",
     "sqlqueue._progress", "sqlqueue._digits"),
    ("sqlqueue.dialects",),
    ("sqlqueue._schema", "sqlqueue._types"),
    ("sqlqueue._errors",),
    ("sqlqueue._moments",),
)  # fmt: skip


def layer_of(module: str) -> int | None:
    """The index in ``LAYERS`` of ``module``'s longest listed prefix; None if it has none."""
    placed = [
        (len(prefix), index)
        for index, prefixes in enumerate(LAYERS)
        for prefix in prefixes
        if module == prefix or module.startswith(f"{prefix}.")
    ]
    return max(placed)[1] if placed else None


@functools.cache
def package_edges(package: str) -> tuple[dict[str, Path], list[Edge]]:
    """The modules of one of ``PACKAGES`` and its imports (parsed once per test run)."""
    modules = modules_of(PACKAGES[package], package)
    return modules, edges_of(modules)


# The checker, on a synthetic package whose imports are known.

SYNTHETIC = {
    "__init__.py": "from pkg.a import A\n",
    "a.py": "from pkg import b\nA = 1\n",
    "b.py": "from .sub.c import C\n",
    "sub/__init__.py": "",
    "sub/c.py": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.d import D\n"
        "def late():\n    from ..a import A\n    return A\n"
        "C = 3\n"
    ),
    "d.py": "import pkg.sub.c\nD = 4\n",
    "e.py": "import typing\nif typing.TYPE_CHECKING:\n    import pkg.d\nelse:\n    import pkg.a\n",
}


def _synthetic(tmp_path: Path) -> dict[str, Path]:
    for name, text in SYNTHETIC.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return modules_of(tmp_path / "pkg", "pkg")


def test_the_checker_reads_relative_lazy_and_type_checking_imports(tmp_path: Path) -> None:
    edges = set(edges_of(_synthetic(tmp_path)))
    assert edges == {
        Edge("pkg", "pkg.a", lazy=False),
        Edge("pkg.a", "pkg.b", lazy=False),
        Edge("pkg.b", "pkg.sub.c", lazy=False),
        Edge("pkg.sub.c", "pkg.a", lazy=True),  # in a function: still an edge
        Edge("pkg.d", "pkg.sub.c", lazy=False),
        Edge("pkg.e", "pkg.a", lazy=False),  # the else of `if TYPE_CHECKING` runs
    }  # and pkg.sub.c -> pkg.d, under TYPE_CHECKING, is not one


def test_the_checker_finds_every_cycle_and_a_path_round_it(tmp_path: Path) -> None:
    graph = graph_of(edges_of(_synthetic(tmp_path)))
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    assert report(graph) == ["pkg.a -> pkg.b -> pkg.sub.c -> pkg.a"]
    two = {"x": {"y"}, "y": {"x", "z"}, "z": set(), "p": {"q"}, "q": {"r"}, "r": {"p", "x"}}
    assert cycles(two) == [["p", "q", "r"], ["x", "y"]]
    assert cycles({"x": {"y"}, "y": {"z"}}) == []


# The real packages.


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_the_package_imports_without_cycles(package: str) -> None:
    modules, edges = package_edges(package)
    assert len(edges) > len(modules) / 2, "the checker found too few imports to be reading them"
    assert report(graph_of(edges)) == []


def test_every_module_has_a_layer() -> None:
    modules, _ = package_edges("sqlqueue")
    assert sorted(module for module in modules if layer_of(module) is None) == []


def upward(edges: Iterable[Edge]) -> list[str]:
    """The imports of ``edges`` that point up ``LAYERS``."""
    return sorted(
        f"{edge.source} -> {edge.target}"
        for edge in edges
        if (layer_of(edge.target) or 0) < (layer_of(edge.source) or 0)
    )


def test_imports_point_down_the_layers() -> None:
    assert upward(package_edges("sqlqueue")[1]) == []


def test_the_layer_check_sees_an_upward_import() -> None:
    assert layer_of("sqlqueue._store.rows") == layer_of("sqlqueue._store") == 3
    assert layer_of("elsewhere") is None
    edges = [
        Edge("sqlqueue._store.rows", "sqlqueue._queue", lazy=True),  # up: store to face
        Edge("sqlqueue._queue", "sqlqueue._store.store", lazy=False),  # down
        Edge("sqlqueue._task", "sqlqueue._worker.pipeline", lazy=False),  # same layer
    ]
    assert upward(edges) == ["sqlqueue._store.rows -> sqlqueue._queue"]


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_module_is_imported_inside_a_function_without_a_reason(package: str) -> None:
    hidden = sorted(
        f"{edge.source} -> {edge.target}"
        for edge in package_edges(package)[1]
        if edge.lazy and edge.target not in LAZY_ALLOWED.get(edge.source, {})
    )
    assert hidden == []


def test_every_allowed_lazy_import_still_exists() -> None:
    edges = {
        (edge.source, edge.target)
        for package in PACKAGES
        for edge in package_edges(package)[1]
        if edge.lazy
    }
    allowed = {(source, target) for source, targets in LAZY_ALLOWED.items() for target in targets}
    assert allowed - edges == set()
