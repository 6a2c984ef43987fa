"""The dialect seam, enforced: outside ``sqlqueue/dialects/``, ``_schema.py`` and ``_types.py``
no module names a database in code or branches on one.

The scan reads each module's syntax tree, so prose is free: docstrings, bare string statements
and comments may say "PostgreSQL"; code may not compare a dialect's name, read a driver, write
a backend's name as a string, or import a backend's SQLAlchemy dialect, its driver or one of
sqlqueue's backend modules.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import sqlqueue
import sqlqueue.dialects
from tests._support.source import parse

PACKAGE = Path(sqlqueue.__file__).resolve().parent
#: Where backends may differ: the dialects, and the column types they choose between.
ALLOWED = ("dialects/", "_schema.py", "_types.py")
#: Top-level modules of database drivers.
DRIVERS = frozenset(
    {"psycopg", "psycopg2", "psycopg_pool", "asyncpg", "sqlite3", "pysqlite3", "aiosqlite"}
    | {"pymysql", "MySQLdb", "mysql", "mariadb", "aiomysql", "asyncmy"}
)
#: A string that is a backend's or driver's name, or a URL scheme made of them.
BACKEND_NAME = re.compile(
    r"(postgres(ql)?|sqlite|mysql|mariadb|psycopg2?|pysqlite|aiosqlite|asyncpg|pymysql|mysqldb"
    r"|aiomysql|asyncmy)(\+\w+)?(:(//)?)?",
    re.IGNORECASE,
)
#: Attributes that say which backend or driver is behind an engine, connection or URL.
BACKEND_ATTRIBUTES = frozenset({"driver", "drivername", "get_backend_name", "get_driver_name"})


def _prose(tree: ast.AST) -> set[int]:
    """The ids of string constants that are docstrings or other bare string statements."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    }


def _names_dialect(node: ast.expr) -> bool:
    """``…dialect`` or ``…dialect()``: the thing whose ``name`` says which database it is."""
    if isinstance(node, ast.Call):
        node = node.func
    label = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return label.lower().endswith("dialect")


def _imports_backend(module: str) -> bool:
    """A driver, a SQLAlchemy backend dialect, or a sqlqueue backend module (the base is
    portable)."""
    top = module.split(".")[0]
    return (
        top in DRIVERS
        or module == "sqlalchemy.dialects"
        or module.startswith("sqlalchemy.dialects.")
        or (
            module.startswith("sqlqueue.dialects.")
            and not f"{module}.".startswith("sqlqueue.dialects._base.")
        )
    )


def backend_branches(source: str) -> list[str]:
    """Every place in ``source`` that names a database in code, as ``line: what``."""
    tree = parse(source)
    prose = _prose(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [
                f"{line}: import {alias.name}"
                for alias in node.names
                if _imports_backend(alias.name)
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [f"{node.module}.{alias.name}" for alias in node.names]
            if _imports_backend(node.module):
                found.append(f"{line}: from {node.module} import …")
            elif node.module == "sqlqueue.dialects":
                found += [
                    f"{line}: from sqlqueue.dialects import {module.rsplit('.', 1)[1]}"
                    for module in modules
                    if module.rsplit(".", 1)[1] not in sqlqueue.dialects.__all__
                ]
            else:
                found += [
                    f"{line}: import {module}" for module in modules if _imports_backend(module)
                ]
        elif isinstance(node, ast.Attribute):
            if node.attr in BACKEND_ATTRIBUTES:
                found.append(f"{line}: .{node.attr}")
            elif node.attr in {"name", "names"} and _names_dialect(node.value):
                found.append(f"{line}: {ast.unparse(node)}")
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in prose
            and BACKEND_NAME.fullmatch(node.value.strip())
        ):
            found.append(f"{line}: {node.value!r}")
    return found


def _guarded_modules() -> list[Path]:
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if not path.relative_to(PACKAGE).as_posix().startswith(ALLOWED)
    )


def test_the_scan_covers_the_package():
    """The guarded set is the package minus the seam, so a renamed folder cannot empty it."""
    names = {path.relative_to(PACKAGE).as_posix() for path in _guarded_modules()}
    assert {"_queue.py", "_store/store.py", "_store/_direct.py", "cli/_main.py"} <= names
    assert not any(name.startswith("dialects/") for name in names)


@pytest.mark.parametrize(
    "path", _guarded_modules(), ids=lambda path: path.relative_to(PACKAGE).as_posix()
)
def test_no_module_outside_the_dialects_branches_on_the_database(path: Path):
    found = backend_branches(path.read_text(encoding="utf-8"))
    assert found == [], (
        f"{path.relative_to(PACKAGE)} names a database; move this behind a Dialect method or "
        f"a supports_* capability: {found}"
    )


@pytest.mark.parametrize(
    "source",
    [
        "if engine.dialect.name == 'sqlite': pass",
        "flag = conn.dialect.name != 'postgresql'",
        "backend = self.engine.dialect.name",
        "if url.get_backend_name() in ('mysql', 'mariadb'): pass",
        "uses_psycopg = engine.dialect.driver == 'psycopg'",
        "scheme = url.drivername",
        "def f(dialect): return dialect.name",
        "TYPE = JSON().with_variant(JSONB(), 'postgresql')",
        "if url.startswith('sqlite:'): pass",
        "url = f\"{'postgresql+psycopg'}://host/db\"",
        "import sqlite3",
        "import psycopg.errors",
        "from psycopg import errors",
        "from sqlalchemy.dialects.postgresql import JSONB",
        "from sqlalchemy.dialects import postgresql",
        "from sqlalchemy import dialects",
        "from sqlqueue.dialects.sqlite import SQLiteDialect",
        "from sqlqueue.dialects import postgresql",
        "import sqlqueue.dialects.postgresql",
    ],
)
def test_the_scan_finds_a_branch_on_the_database(source: str):
    assert backend_branches(source) != []


@pytest.mark.parametrize(
    "source",
    [
        '"""Runs on PostgreSQL and on SQLite."""',
        'def f():\n    """SQLite takes the write lock up front."""\n    return 1',
        "x = 1  # PostgreSQL: SKIP LOCKED",
        "LIMIT = 3\n'''The limit on sqlite.'''",
        "message = 'expected e.g. sqlite:///jobs.db or postgresql+psycopg://user@host/db'",
        "from sqlqueue.dialects import Dialect, dialect_for",
        "from sqlqueue.dialects._base import WAKE_CHANNEL",
        "if dialect.supports_row_locks: pass",
        "queue_name = job.name",
    ],
)
def test_the_scan_leaves_prose_and_capabilities_alone(source: str):
    assert backend_branches(source) == []
