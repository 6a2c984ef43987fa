"""Bulk enqueue from a JSON array (``BulkPath.JSON_ARRAY``, SQLite): thousands of rows in one
statement, as one JSON parameter.

SQLAlchemy's multi-row INSERT needs to match ``RETURNING`` rows to parameters, which SQLite
does not promise to return in order, so it sends one statement per row; and binding every value
of every row through its type processors costs more than SQLite's insert itself. Here the rows
travel as one JSON array (encoded in C, payloads embedded as text) that
``INSERT … SELECT … FROM json_each(:rows) ORDER BY key`` unpacks in order.

Ids come back in no promised order, but SQLite gives each new row the next rowid (one more
than the largest) while the statement holds the write lock, so the ids written are consecutive
and ascending in insertion order: sorted, they map to the rows written, in order. Rows with
keys are checked against the key each id came back with, and a gap (a rowid allocation that is
not "largest plus one") is refused rather than guessed at.

The columns come from ``sqlqueue._schema.ENQUEUE_COLUMNS``; the dialect says how its database
reads a JSON array as rows (``json_each`` and ``json_extract`` on SQLite).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any, Final

from sqlalchemy import Connection, Float, String, bindparam, func, literal, select, true

from sqlqueue._errors import EnqueueError
from sqlqueue._payload import JSON_ENCODER
from sqlqueue._schema import ENQUEUE_COLUMNS, ROW_COLUMNS, ColumnKind, Fill, JobColumn, jobs
from sqlqueue._types import EncodedJson, UtcDateTime
from sqlqueue.dialects import Dialect

__all__ = ["insert_jobs_from_json"]

#: Rows per statement: bounds the JSON text held at once (~50 bytes a row plus payloads).
ROWS_PER_STATEMENT: Final = 5000
#: Each row's values in the JSON array, by position: the row's columns, then its due time.
_FIELDS: Final = (*(column.name for column in ROW_COLUMNS), "_run_at", "_delay")
_pick: Final = itemgetter(*(column.name for column in ROW_COLUMNS))
_KEY: Final = jobs.c.idempotency_key.name
_ENCODER: Final = JSON_ENCODER

_STATEMENTS: dict[tuple[type[Dialect], bool], Any] = {}


def _statement(dialect: Dialect, *, due_in_rows: bool) -> Any:
    """``INSERT INTO sqlqueue_jobs … SELECT … FROM json_each(:rows) ORDER BY key ON CONFLICT
    (idempotency_key) DO NOTHING RETURNING id, idempotency_key``, built once. Without
    ``due_in_rows`` every row is due now: its ``run_at`` and ``delay`` are not read."""
    found = _STATEMENTS.get((type(dialect), due_in_rows))
    if found is not None:
        return found
    each = dialect.json_array_rows(bindparam("rows", type_=String()))

    def field(name: str, type_: Any) -> Any:
        return dialect.json_element(each.c.value, _FIELDS.index(name), type_)

    clock = dialect.clock()
    due = (
        func.coalesce(
            field("_run_at", UtcDateTime()),
            dialect.clock_plus(field("_delay", Float())),
            type_=UtcDateTime(),
        )
        if due_in_rows
        else clock
    )

    def value(column: JobColumn) -> Any:
        if column.fill is Fill.ROW:  # JSON embedded as text
            json = column.kind in (ColumnKind.JSON, ColumnKind.JSON_LIST)
            return field(column.name, String() if json else jobs.c[column.name].type)
        if column.fill is Fill.DUE:
            return due
        if column.fill is Fill.CLOCK:
            return clock
        if column.kind in (ColumnKind.JSON, ColumnKind.JSON_LIST):
            return bindparam(f"sqlqueue_{column.name}", column.constant, type_=EncodedJson())
        return literal(column.constant)

    values = [value(column) for column in ENQUEUE_COLUMNS]
    # SQLite needs a WHERE in INSERT … SELECT … ON CONFLICT (or it parses ON as a join's).
    rows = select(*values).select_from(each).where(true()).order_by(each.c.key)
    found = (
        dialect.insert_ignoring_duplicate_keys()
        .from_select([jobs.c[column.name] for column in ENQUEUE_COLUMNS], rows)
        .returning(jobs.c.id, jobs.c.idempotency_key)
    )
    _STATEMENTS[(type(dialect), due_in_rows)] = found
    return found


def insert_jobs_from_json(
    dialect: Dialect, conn: Connection, rows: Sequence[Mapping[str, Any]]
) -> list[int | None]:
    """Write ``rows`` (checked, distinct keys); one id per row, ``None`` where a job with the
    row's key exists."""
    to_text = UtcDateTime().dialect_impl(conn.dialect).bind_processor(conn.dialect)
    pick = _pick
    ids: list[int | None] = []
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[start : start + ROWS_PER_STATEMENT]
        due_in_rows = any(row["_run_at"] is not None or row["_delay"] for row in chunk)
        document = _ENCODER.encode(
            [
                [
                    *pick(row),
                    None if row["_run_at"] is None or to_text is None else to_text(row["_run_at"]),
                    row["_delay"],
                ]
                for row in chunk
            ]
        )
        statement = _statement(dialect, due_in_rows=due_in_rows)
        returned = conn.execute(statement, {"rows": document}).all()
        ids.extend(_match(chunk, returned))
    return ids


def _match(rows: Sequence[Mapping[str, Any]], returned: Sequence[Any]) -> list[int | None]:
    """Ids for ``rows`` from the ``(id, key)`` pairs one statement returned (see above)."""
    by_key = {key: int(job_id) for job_id, key in returned if key is not None}
    written = [i for i, row in enumerate(rows) if row[_KEY] in by_key or row[_KEY] is None]
    new_ids = sorted(int(job_id) for job_id, _ in returned)
    if len(new_ids) != len(written) or (new_ids and new_ids[-1] - new_ids[0] + 1 != len(new_ids)):
        raise EnqueueError(_UNMATCHED)
    ids: list[int | None] = [None] * len(rows)
    for index, job_id in zip(written, new_ids, strict=True):
        key = rows[index][_KEY]
        if key is not None and by_key[key] != job_id:
            raise EnqueueError(_UNMATCHED)
        ids[index] = job_id
    return ids


_UNMATCHED: Final = (
    "SQLite returned ids that cannot be matched to the rows written (rowids not consecutive: "
    "is the table's largest id at the 64-bit limit?); roll back, and enqueue these jobs one "
    "at a time"
)
