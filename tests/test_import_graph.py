"""The package's import graph: no cycles between sqlqueue's modules, and no imports hidden in
functions to dodge one. A cycle is what made ``Queue.worker()`` import the worker lazily; this
test keeps the graph a tree-like hierarchy as modules move and grow."""

from __future__ import annotations

import ast
from pathlib import Path

import sqlqueue

PACKAGE = Path(sqlqueue.__file__).parent

#: Imports inside functions that are deliberate: optional dependencies loaded only when used,
#: and the public kinds' entry points, which the core never imports at module level.
LAZY_ALLOWED = {
    # A receiver verifies signatures with sqlqueue.webhooks and no HTTP client installed: the
    # sending side (httpx) loads with the first delivery.
    "sqlqueue.webhooks._webhooks": {"sqlqueue.webhooks._http", "sqlqueue.webhooks._policy"},
    # prometheus_client loads only in a worker started with metrics_port.
    "sqlqueue._worker.observe": {"sqlqueue._worker.prometheus"},
    # Starlette, Jinja2 and uvicorn load only for `sqlqueue web`.
    "sqlqueue._cli": {"sqlqueue.web._serve"},
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    """The sqlqueue modules an import statement loads (a ``from package import module`` counts
    as the module)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".")
            if MODULES[module].name != "__init__.py":
                package = package[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, base] if base else package)
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                 for alias in node.names]  # fmt: skip
    return [name for name in names if name.split(".")[0] == "sqlqueue" and name in MODULES]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str) -> tuple[set[str], set[str]]:
    """``(at import time, inside functions)``: the sqlqueue modules ``module`` imports."""
    tree = ast.parse(MODULES[module].read_text())
    eager: set[str] = set()
    lazy: set[str] = set()

    def visit(node: ast.AST, *, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                continue  # annotations only: no import at run time
            if isinstance(child, ast.Import | ast.ImportFrom):
                (lazy if in_function else eager).update(_targets(child, module))
            nested = in_function or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            visit(child, in_function=nested)

    visit(tree, in_function=False)
    return eager - {module}, lazy - {module}


def test_sqlqueue_modules_import_each_other_without_cycles() -> None:
    graph = {module: _imports(module)[0] for module in MODULES}
    # The root package imports the public API from everywhere: edges into it are not followed.
    order: list[str] = []
    state: dict[str, str] = {}

    def walk(module: str, path: list[str]) -> None:
        if state.get(module) == "done":
            return
        if state.get(module) == "open":
            cycle = [*path[path.index(module) :], module]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        state[module] = "open"
        for target in sorted(graph[module]):
            if target != "sqlqueue":
                walk(target, [*path, module])
        state[module] = "done"
        order.append(module)

    for module in sorted(graph):
        walk(module, [])
    assert len(order) == len(MODULES)


def test_no_sqlqueue_module_is_imported_inside_a_function_to_dodge_a_cycle() -> None:
    hidden = {
        module: sorted(lazy - LAZY_ALLOWED.get(module, set()))
        for module in MODULES
        for lazy in [_imports(module)[1]]
        if lazy - LAZY_ALLOWED.get(module, set())
    }
    assert hidden == {}
