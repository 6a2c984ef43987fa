"""The one-job INSERT that leaves the optional columns out (``one_bare`` in
``sqlqueue/_store/inserts.py``): taken only when every one of them is ``None``, and writing the
row the full statement writes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._jobrow import JobRow
from sqlqueue._schema import jobs
from sqlqueue._store.inserts import _OPTIONAL, _bare

#: A value each optional column could hold (only ``None`` vs not matters to ``_bare``).
_SET = {
    "idempotency_key": "k",
    "group_key": "g",
    "trace_context": "{}",
    "batch_id": 1,
    "limit_key": "l",
    "unique_key": "u" * 64,
    "expires_at": datetime(2030, 1, 1, tzinfo=UTC),
}


def _row(**values: object) -> JobRow:
    row: dict[str, object] = {
        "job_type": "t",
        "queue": "default",
        "priority": 0,
        "payload": "{}",
        "max_attempts": 3,
        **dict.fromkeys(_OPTIONAL),
        "_run_at": None,
        "_delay": 0.0,
    }
    row.update(values)
    return row  # type: ignore[return-value]


def test_the_optional_columns_are_the_nullable_row_columns_a_feature_sets():
    assert set(_OPTIONAL) == set(_SET)


@pytest.mark.parametrize("name", [name for name in _OPTIONAL if name != "idempotency_key"])
def test_a_row_with_any_optional_column_set_is_not_bare(name: str):
    """A keyed row never reaches ``_bare`` (it has statements of its own); every other
    optional column must keep a row off the statement that leaves it out."""
    assert _bare(_row())
    assert not _bare(_row(**{name: _SET[name]}))


def test_a_bare_job_is_the_row_the_full_statement_writes(backend):
    """A plain job (bare INSERT) and a grouped one (full INSERT) differ in their group only."""
    queue = backend.queue()
    with backend.engine.begin() as conn:
        plain = queue.enqueue(conn, "t", {"n": 1}, external=True)
        grouped = queue.enqueue(conn, "t", {"n": 1}, external=True, group_key="g")
    skip = {"id", "group_key", "created_at", "updated_at", "next_run_at"}
    columns = [column for column in jobs.c if column.name not in skip]
    with backend.engine.connect() as conn:
        found = {
            row.id: row
            for row in conn.execute(
                sa.select(jobs.c.id, *columns).where(jobs.c.id.in_([plain, grouped]))
            )
        }
    assert found[plain][1:] == found[grouped][1:]
    job = queue.get_job(plain)
    assert isinstance(job, sqlqueue.Job)
    assert job.group_key is None
    assert job.status == "queued"
    assert job.payload == {"n": 1}
