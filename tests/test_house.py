"""The house's rules, checked: dialects sit below the store, and the job columns enqueue writes and
a claim returns are spelled once (``sqlqueue._schema.JOB_COLUMNS``), every path derived from it.

The SQL is checked as each database receives it (SQLite, PostgreSQL and MariaDB, captured with
SQLAlchemy's ``after_cursor_execute`` event while the public API enqueues and claims), not by
compiling the store's private statement builders."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given, settings
from hypothesis import strategies as st

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
from sqlqueue._store.claim import loads_document
from sqlqueue._store.rows import ClaimedJob, _fill_every_field, claims_from_rows
from sqlqueue._types import JsonDocument, UtcDateTime
from sqlqueue._worker.classify import Outcome, succeeded
from sqlqueue.dialects import dialect_for
from tests._support.source import parse

DIALECTS_DIR = Path(sqlqueue.__file__).parent / "dialects"
#: What a dialect may import of sqlqueue, besides sqlqueue.dialects itself.
DIALECT_MAY_IMPORT = {"sqlqueue._schema", "sqlqueue._types", "sqlqueue._errors"}

ENQUEUED = [column.name for column in ENQUEUE_COLUMNS]
ROW = [column.name for column in ROW_COLUMNS]
CLAIMED = [column.name for column in CLAIM_COLUMNS]


def _sqlqueue_imports(path: Path) -> set[str]:
    """The sqlqueue modules ``path`` imports (``from sqlqueue import x`` counts as
    ``sqlqueue.x``, which is a module or a name of the package: either is the package's)."""
    package = "sqlqueue.dialects"
    found: set[str] = set()
    for node in ast.walk(parse(path.read_text(), filename=str(path))):
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
    assert list(JobRow.__annotations__) == [*ROW, "_run_at", "_delay", "_unique", "_tags"]
    assert [column.name for column in ENQUEUE_COLUMNS if column.fill is Fill.DUE] == ["next_run_at"]


@dataclass(frozen=True)
class Executed:
    """One statement as it reached the driver, and the names of the columns it returned."""

    sql: str
    returned: tuple[str, ...] | None


@contextmanager
def executed(engine: sa.Engine) -> Iterator[list[Executed]]:
    """Every statement ``engine`` sends while the block runs, compiled for its database."""
    seen: list[Executed] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:
        names = tuple(d[0] for d in cursor.description) if cursor.description else None
        seen.append(Executed(statement, names))

    sa.event.listen(engine, "after_cursor_execute", record)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "after_cursor_execute", record)


INSERT_INTO_JOBS = re.compile(r"INSERT INTO [`\"]?sqlqueue_jobs[`\"]? \(([^)]*)\)")


def _written_columns(sql: str) -> list[str] | None:
    """The column list of an INSERT into the jobs table (``None``: not one)."""
    match = INSERT_INTO_JOBS.search(sql)
    if match is None:
        return None
    return [name.strip().strip('`"') for name in match.group(1).split(",")]


def test_every_enqueue_path_writes_exactly_the_enqueued_columns(backend):
    """One job, now or later, with a key or not; several; and a bulk of COPY's size: every
    INSERT the database receives names each enqueued column once (and the id, where the bulk
    path allocates it), on each backend's compiled SQL."""
    queue = backend.queue()

    @queue.task("t")
    def t(n: int = 0) -> None:
        return None

    later = datetime(2030, 1, 1, tzinfo=UTC)
    many = [sqlqueue.JobRequest(job_type="t", payload={"n": n}) for n in range(3)]
    keyed = [
        sqlqueue.JobRequest(job_type="t", payload={"n": n}, idempotency_key=f"many-{n}")
        for n in range(3)
    ]
    bulk = [sqlqueue.JobRequest(job_type="t", payload={"n": n}, delay=n) for n in range(250)]
    with executed(backend.engine) as seen, backend.engine.begin() as conn:
        queue.enqueue(conn, "t", {"n": 1})
        queue.enqueue(conn, "t", {"n": 2}, idempotency_key="one")
        queue.enqueue(conn, "t", {"n": 3}, run_at=later)
        queue.enqueue(conn, "t", {"n": 4}, idempotency_key="one-later", delay=60)
        queue.enqueue_many(conn, many)
        queue.enqueue_many(conn, keyed)
        queue.enqueue_many(conn, bulk)

    inserts = {e.sql: _written_columns(e.sql) for e in seen if _written_columns(e.sql)}
    assert len(inserts) >= 3, f"expected several INSERT forms, saw {list(inserts)}"
    for sql, columns in inserts.items():
        assert columns is not None
        assert len(set(columns)) == len(columns), sql
        assert set(columns) - {"id"} == set(ENQUEUED), sql
    assert queue.stats().by_status["queued"] == 4 + 3 + 3 + 250


def test_the_claim_returns_the_claimed_columns_in_spec_order(backend):
    """The claim's rows, as the database returns them (``UPDATE … RETURNING``, or on MariaDB
    the SELECT by id that follows the UPDATE), carry the spec's claimed columns in order."""
    queue = backend.queue()

    @queue.task("t")
    def t() -> None:
        return None

    with backend.engine.begin() as conn:
        t.enqueue(conn)
    with executed(backend.engine) as seen:
        queue.worker(poll_interval=0.02).run(burst=True)

    claims = [n for n, e in enumerate(seen) if "UPDATE" in e.sql and "attempts + " in e.sql]
    assert claims, "no claim statement was sent: " + "\n".join(e.sql[:120] for e in seen)
    claim = seen[claims[0]]
    returned = claim.returned if claim.returned is not None else seen[claims[0] + 1].returned
    assert returned == tuple(CLAIMED), claim.sql
    returning = dialect_for(backend.engine).claim_returning()
    assert tuple(column.name for column in returning) == tuple(CLAIMED)


def test_a_bulk_enqueue_stores_every_field_of_each_request(backend):
    """The bulk paths (COPY, a JSON array, multi-row VALUES) fill each enqueued column from
    its own field of the request: read back, every job is the request it came from."""
    queue = backend.queue()

    @queue.task("t")
    def t(n: int = 0) -> None:
        return None

    requests = [
        sqlqueue.JobRequest(
            job_type="t",
            payload={"n": n},
            queue=f"q{n % 3}",
            priority=n % 7,
            max_attempts=1 + n % 4,
            group_key=f"g{n % 5}" if n % 2 else None,
            idempotency_key=f"k{n}" if n % 3 == 0 else None,
            delay=float(n),
        )
        for n in range(250)
    ]
    before = queue.database_now()
    with backend.engine.begin() as conn:
        ids = queue.enqueue_many(conn, requests)
    after = queue.database_now()
    stored = {job.id: job for job in queue.jobs(job_ids=ids, limit=len(ids))}
    for job_id, request in zip(ids, requests, strict=True):
        job = stored[job_id]
        n = request.payload["n"]
        assert (job.job_type, job.payload, job.queue, job.status, job.attempts) == (
            "t",
            {"n": n},
            request.queue,
            "queued",
            0,
        ), job_id
        assert (job.priority, job.max_attempts) == (request.priority, request.max_attempts)
        assert (job.group_key, job.idempotency_key) == (request.group_key, request.idempotency_key)
        assert before <= job.created_at <= after
        assert job.created_at + timedelta(seconds=n) - timedelta(milliseconds=5) <= job.next_run_at
        assert job.next_run_at <= after + timedelta(seconds=n)


def test_claimed_rows_are_read_into_their_fields_by_the_spec():
    # Every field but the process's own clock reading at the claim comes from a column.
    assert {field.name for field in dataclasses.fields(ClaimedJob)} - {"claimed_clock"} == {
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


def test_claimed_jobs_read_from_rows_are_whole_frozen_dataclasses():
    # The claim reader sets each job's fields itself rather than calling __init__:
    # what it makes must equal the constructor's job field for field, and stay frozen.
    at = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    values = {
        "id": 7,
        "job_type": "noop",
        "queue": "default",
        "priority": 0,
        "payload": '{"n": 1}',
        "attempts": 1,
        "max_attempts": 8,
        "errors": "[]",
        "next_run_at": at,
        "created_at": at,
        "trace_context": None,
        "batch_id": None,
        "started_at": at,
        "lease_expires_at": at,
    }
    assert list(values) == [column.name for column in CLAIM_COLUMNS]
    (job,) = claims_from_rows([tuple(values.values())], document=json.loads)
    built = ClaimedJob(
        id=7,
        job_type="noop",
        queue="default",
        priority=0,
        payload={"n": 1},
        attempt=1,
        max_attempts=8,
        errors=(),
        next_run_at=at,
        created_at=at,
        batch_id=None,
        started_at=at,
        lease_expires_at=at,
        trace_context=None,
        claimed_clock=job.claimed_clock,
    )
    assert job == built
    assert vars(job) == vars(built)
    assert job.fence == (7, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.attempt = 2  # type: ignore[misc]


def test_the_claim_reader_is_not_made_when_a_field_would_stay_unset():
    columns = [column.field for column in CLAIM_COLUMNS]
    _fill_every_field(columns)
    with pytest.raises(RuntimeError, match="lease_expires_at"):
        _fill_every_field([name for name in columns if name != "lease_expires_at"])


def test_a_success_made_by_succeeded_equals_the_outcome_its_constructor_makes():
    # succeeded() sets the frozen Outcome's fields itself (its __init__ cost the loop a
    # microsecond or two per job): same fields, same values, still frozen.
    (job,) = claims_from_rows(
        [
            (1, "noop", "default", 0, "{}", 1, 8, "[]", *[datetime(2026, 1, 1)] * 2, None, None)
            + (datetime(2026, 1, 1),) * 2
        ],
        document=json.loads,
    )
    plain = succeeded(job, 0.25, {"ok": True})
    assert plain == Outcome(job=job, failure=None, elapsed=0.25, result={"ok": True})
    assert vars(plain) == vars(Outcome(job=job, failure=None, elapsed=0.25, result={"ok": True}))
    recorded = succeeded(job, 0.5, None, recorded=True, landed=True, claimable=frozenset({"q"}))
    assert recorded == Outcome(
        job=job,
        failure=None,
        elapsed=0.5,
        recorded=True,
        landed=True,
        claimable=frozenset({"q"}),
    )
    assert recorded.succeeded
    with pytest.raises(dataclasses.FrozenInstanceError):
        plain.elapsed = 1.0  # type: ignore[misc]


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200)
@given(
    value=_JSON_VALUES,
    before=st.sampled_from(["", " ", "\n"]),
    after=st.sampled_from(["", " ", "\t", "x", "]", "1"]),
)
def test_the_claims_json_reader_reads_exactly_as_json_loads(value, before, after):
    # loads_document scans a claimed document with json's C scanner alone (0.6 µs a job
    # less than json.loads): whatever the text, it must return or raise as json.loads does.
    text = before + json.dumps(value) + after
    try:
        expected: Any = ("value", json.loads(text))
    except json.JSONDecodeError as error:
        expected = ("error", error.msg)
    try:
        got: Any = ("value", loads_document(text))
    except json.JSONDecodeError as error:
        got = ("error", error.msg)
    assert got == expected
    for text in ("", " ", "nul", '{"a": 1', "[1,]"):
        with pytest.raises(json.JSONDecodeError):
            loads_document(text)
