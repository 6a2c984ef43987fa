"""The house's rules, checked: dialects sit below the store, and the job columns enqueue writes and
a claim returns are spelled once (``sqlqueue._schema.JOB_COLUMNS``), every path derived from it."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

import sqlqueue
from sqlqueue._jobrow import JobRow
from sqlqueue._schema import (
    CLAIM_COLUMNS,
    ENQUEUE_COLUMNS,
    JOB_COLUMNS,
    ROW_COLUMNS,
    ColumnKind,
    Fill,
    jobs,
)
from sqlqueue._store import bulk_copy, bulk_json, inserts
from sqlqueue._store.rows import ClaimedJob, claims_from_rows
from sqlqueue._types import JsonDocument, UtcDateTime
from sqlqueue.dialects import Dialect
from sqlqueue.dialects.postgresql import PostgresDialect
from sqlqueue.dialects.sqlite import SQLiteDialect

DIALECTS_DIR = Path(sqlqueue.__file__).parent / "dialects"
#: What a dialect may import of sqlqueue, besides sqlqueue.dialects itself.
DIALECT_MAY_IMPORT = {"sqlqueue._schema", "sqlqueue._types", "sqlqueue._errors"}

#: Each sqlqueue dialect with the SQLAlchemy dialect it compiles for (no database needed).
COMPILERS: list[tuple[Dialect, sa.engine.Dialect]] = [
    (SQLiteDialect(), sqlite.dialect()),
    (PostgresDialect(), postgresql.dialect()),
]

ENQUEUED = [column.name for column in ENQUEUE_COLUMNS]
ROW = [column.name for column in ROW_COLUMNS]
CLAIMED = [column.name for column in CLAIM_COLUMNS]


def _sqlqueue_imports(path: Path) -> set[str]:
    """The sqlqueue modules ``path`` imports (``from sqlqueue import x`` counts as
    ``sqlqueue.x``, which is a module or a name of the package: either is the package's)."""
    package = "sqlqueue.dialects"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against sqlqueue.dialects
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            found.add(module)
            if module == "sqlqueue":
                found |= {f"sqlqueue.{alias.name}" for alias in node.names}
    return {name for name in found if name == "sqlqueue" or name.startswith("sqlqueue.")}


def test_dialects_import_nothing_from_the_store_above_them():
    modules = sorted(DIALECTS_DIR.glob("*.py"))
    assert modules, "no dialect modules found"
    wrong = {
        f"{path.name}: {name}"
        for path in modules
        for name in _sqlqueue_imports(path)
        if name not in DIALECT_MAY_IMPORT
        and name != "sqlqueue.dialects"
        and not name.startswith("sqlqueue.dialects.")
    }
    assert not wrong, f"dialects may import only {sorted(DIALECT_MAY_IMPORT)}: {sorted(wrong)}"


def test_the_import_check_sees_what_a_dialect_must_not_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from sqlqueue._store.rows import ClaimedJob\nimport sqlqueue._job\n"
        "from sqlqueue import Queue\nfrom .. import _jobrow\nfrom ._base import Dialect\n"
    )
    assert _sqlqueue_imports(bad) == {
        "sqlqueue._store.rows",
        "sqlqueue._job",
        "sqlqueue",
        "sqlqueue.Queue",
        "sqlqueue._jobrow",
        "sqlqueue.dialects._base",
    }


# -- one job-row spec --------------------------------------------------------------------------


def test_every_spec_column_is_a_column_of_the_jobs_table():
    names = [column.name for column in JOB_COLUMNS]
    assert len(set(names)) == len(names)
    assert set(names) <= set(jobs.c.keys())
    for column in JOB_COLUMNS:
        if column.kind is ColumnKind.TIMESTAMP:
            assert isinstance(jobs.c[column.name].type, UtcDateTime)
        if column.kind in (ColumnKind.JSON, ColumnKind.JSON_LIST):
            assert jobs.c[column.name].type is JsonDocument


def test_every_enqueued_column_exists_in_the_migrated_table(backend):
    columns = {column["name"] for column in sa.inspect(backend.engine).get_columns(jobs.name)}
    missing = [name for name in ENQUEUED + CLAIMED if name not in columns]
    assert not missing, f"spec columns the migrations do not create: {missing}"


def test_the_job_row_carries_exactly_the_spec_row_columns_and_the_due_inputs():
    assert list(JobRow.__annotations__) == [*ROW, "_run_at", "_delay"]
    assert [column.name for column in ENQUEUE_COLUMNS if column.fill is Fill.DUE] == ["next_run_at"]


def _insert_columns(statement: Any, dialect: sa.engine.Dialect) -> list[str]:
    sql = str(statement.compile(dialect=dialect, column_keys=list(JobRow.__required_keys__)))
    match = re.search(r"INSERT INTO sqlqueue_jobs \(([^)]*)\)", sql)
    assert match, sql
    return [name.strip() for name in match.group(1).split(",")]


def _in_table_order(names: list[str]) -> list[str]:
    """``names`` in the jobs table's column order, which is SQLAlchemy's INSERT order."""
    return [column.name for column in jobs.c if column.name in names]


@pytest.mark.parametrize(("dialect", "compiler"), COMPILERS, ids=["sqlite", "postgresql"])
def test_every_insert_writes_exactly_the_enqueued_columns(dialect, compiler):
    statements = inserts._build_statements(dialect)
    for name in ("one", "one_keyed", "one_now", "one_keyed_now"):
        statement = getattr(statements, name).statement
        assert _insert_columns(statement, compiler) == _in_table_order(ENQUEUED), name
    for statement in (statements.many, statements.many_keyed):
        assert _insert_columns(statement, compiler) == _in_table_order(ENQUEUED)


def test_the_json_array_path_carries_the_row_columns_and_writes_the_enqueued_ones():
    assert list(bulk_json._FIELDS) == [*ROW, "_run_at", "_delay"]
    for due_in_rows in (True, False):
        statement = bulk_json._statement(SQLiteDialect(), due_in_rows=due_in_rows)
        assert _insert_columns(statement, sqlite.dialect()) == ENQUEUED


def test_the_copy_path_writes_the_enqueued_columns_from_the_row_by_name():
    assert set(bulk_copy._DIRECT_COLUMNS) == {"id", *ENQUEUED} - {"idempotency_key"}
    assert list(bulk_copy._STAGED_COLUMNS) == ["id", *ROW, "next_run_at"]
    assert [column.name for column in bulk_copy._staging.columns] == ["id", *ROW, "next_run_at"]
    _, move = bulk_copy._statements(PostgresDialect())
    assert _insert_columns(move, postgresql.dialect()) == ["id", *ENQUEUED]

    now = datetime(2026, 1, 2, tzinfo=UTC)
    row: JobRow = {
        "job_type": "t",
        "queue": "q",
        "priority": 3,
        "payload": '{"a":1}',
        "max_attempts": 4,
        "idempotency_key": None,
        "group_key": "g",
        "batch_id": 11,
        "_run_at": None,
        "_delay": 5.0,
    }
    (direct,) = bulk_copy._direct_rows([row], [7], now)
    written = dict(zip(bulk_copy._DIRECT_COLUMNS, direct, strict=True))
    assert written == {
        "id": 7,
        **{name: row[name] for name in ROW if name != "idempotency_key"},  # type: ignore[literal-required]
        "status": "queued",
        "attempts": 0,
        "errors": "[]",
        "next_run_at": now + timedelta(seconds=5),
        "created_at": now,
        "updated_at": now,
    }
    (staged,) = bulk_copy._staged_rows([{**row, "idempotency_key": "k"}], [7], now)
    assert dict(zip(bulk_copy._STAGED_COLUMNS, staged, strict=True)) == {
        "id": 7,
        **{name: row[name] for name in ROW},  # type: ignore[literal-required]
        "idempotency_key": "k",
        "next_run_at": now + timedelta(seconds=5),
    }


@pytest.mark.parametrize(("dialect", "compiler"), COMPILERS, ids=["sqlite", "postgresql"])
def test_the_claim_returns_the_claimed_columns_in_spec_order(dialect, compiler):
    statement = dialect.claim_statement(
        queues=["default"], job_types=None, lease_seconds=30, now=None
    )
    returned = [column.name for column in statement._returning]
    assert returned == CLAIMED
    assert [column.name for column in dialect.claim_returning()] == CLAIMED


def test_claimed_rows_are_read_into_their_fields_by_the_spec():
    assert {field.name for field in dataclasses.fields(ClaimedJob)} == {
        column.field for column in CLAIM_COLUMNS
    }
    at = datetime(2026, 1, 2, 3, 4, 5)
    values: dict[str, Any] = {}
    for n, column in enumerate(CLAIM_COLUMNS):
        if column.kind is ColumnKind.TIMESTAMP:
            values[column.name] = at + timedelta(seconds=n)
        elif column.kind is ColumnKind.JSON:
            values[column.name] = f'{{"n":{n}}}'
        elif column.kind is ColumnKind.JSON_LIST:
            values[column.name] = f'[{{"n":{n}}}]'
        else:
            values[column.name] = f"value {n}"
    (job,) = claims_from_rows([tuple(values.values())], document=json.loads)
    for n, column in enumerate(CLAIM_COLUMNS):
        read = getattr(job, column.field)
        if column.kind is ColumnKind.TIMESTAMP:
            assert read == (at + timedelta(seconds=n)).replace(tzinfo=UTC), column.name
        elif column.kind is ColumnKind.JSON:
            assert read == {"n": n}, column.name
        elif column.kind is ColumnKind.JSON_LIST:
            assert read == ({"n": n},), column.name
        else:
            assert read == f"value {n}", column.name
