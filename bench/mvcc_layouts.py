"""Raw-SQL job-table layouts for ``python -m bench --only mvcc``: today's and the levers tried
against a long-held transaction (PostgreSQL only).

- ``today``: sqlqueue's schema and the raw ceiling's claim (``bench.raw_sql``): one job table,
  a partial claim index on the claimable statuses, rows updated in place.
- ``fillfactor``: the same, with ``fillfactor = 70`` on the table and its claim index and
  per-table autovacuum settings that vacuum after every 1,000 dead rows, unthrottled.
- ``floor``: the same table; the claim starts its index scan at a floor the worker keeps (the
  claim order key of the first job of its last claim, its due time less ``FLOOR_SLACK_SECONDS``
  for enqueues that commit late), so it does not walk the dead versions of the jobs it has
  already claimed; every ``FLOOR_RESET_SECONDS`` one claim runs without the floor, which finds
  jobs that sort before it (a higher priority, an earlier due time).
- ``timefloor``: as ``floor``, but the floor bounds only the due time (``next_run_at >=``), for
  every priority: the index scan still starts at the queue's first entry, but rejects the dead
  entries from the index tuple alone, without visiting the table.
- ``hot``: claimable and running jobs live in a small table; a completion deletes the row there
  and inserts it into a history table in the same statement.

Each layout is a set of statements; ``bench.mvcc_worker`` runs the worker side, ``bench.mvcc``
the enqueue side. Every value is bound; the SQL text is constant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["FLOOR_RESET_SECONDS", "FLOOR_SLACK_SECONDS", "LAYOUTS", "Layout"]

#: How often a ``floor`` worker claims once without its floor.
FLOOR_RESET_SECONDS: Final = 10.0
#: How far before the due time of its last claim's first job a floor starts.
FLOOR_SLACK_SECONDS: Final = 2.0

_CLAIM: Final = """
WITH due AS MATERIALIZED (
    SELECT id FROM {table}
     WHERE status IN ('queued', 'failed') AND queue = %(queue)s
       AND next_run_at <= statement_timestamp() {floor}
     ORDER BY priority, next_run_at, id
     LIMIT %(batch)s
       FOR UPDATE SKIP LOCKED)
UPDATE {table} AS j
   SET status = 'running', attempts = j.attempts + 1, locked_by = %(worker)s,
       started_at = statement_timestamp(), updated_at = statement_timestamp(),
       lease_expires_at = statement_timestamp() + make_interval(secs => %(lease)s)
  FROM due WHERE j.id = due.id
RETURNING j.id, j.attempts, j.priority, j.next_run_at
"""
_FLOOR: Final = (
    "AND (priority, next_run_at, id) >= "
    "(%(priority)s, %(next_run_at)s - make_interval(secs => %(slack)s), 0)"
)
_TIME_FLOOR: Final = "AND next_run_at >= %(next_run_at)s - make_interval(secs => %(slack)s)"
_COMPLETE: Final = """
UPDATE sqlqueue_jobs
   SET status = 'succeeded', finished_at = statement_timestamp(),
       updated_at = statement_timestamp(), lease_expires_at = NULL
 WHERE (id, attempts) IN (SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]))
   AND status = 'running' AND locked_by = %(worker)s
"""
_INSERT: Final = """
INSERT INTO {table} (job_type, queue, priority, payload, status, attempts, max_attempts, errors,
                     next_run_at, created_at, updated_at)
SELECT 'noop', 'default', 0, '{{}}'::jsonb, 'queued', 0, 8, '[]'::jsonb,
       statement_timestamp(), statement_timestamp(), statement_timestamp()
  FROM generate_series(1, %(jobs)s)
"""
_FILLFACTOR: Final = (
    "ALTER TABLE sqlqueue_jobs SET (fillfactor = 70, autovacuum_vacuum_scale_factor = 0, "
    "autovacuum_vacuum_threshold = 1000, autovacuum_vacuum_insert_scale_factor = 0, "
    "autovacuum_vacuum_insert_threshold = 1000, autovacuum_vacuum_cost_delay = 0)",
    "ALTER INDEX ix_sqlqueue_jobs_claim SET (fillfactor = 70)",
)
# The hot table: the columns a claim and a completion need, its claim index, and the history.
_HOT_SCHEMA: Final = (
    """CREATE TABLE sqlqueue_hot (
        id bigserial PRIMARY KEY, job_type text NOT NULL, queue text NOT NULL,
        priority integer NOT NULL, payload jsonb NOT NULL, status text NOT NULL,
        attempts integer NOT NULL, max_attempts integer NOT NULL, errors jsonb NOT NULL,
        next_run_at timestamptz NOT NULL, created_at timestamptz NOT NULL,
        updated_at timestamptz NOT NULL, locked_by text, started_at timestamptz,
        lease_expires_at timestamptz)""",
    """CREATE INDEX ix_sqlqueue_hot_claim ON sqlqueue_hot (queue, priority, next_run_at, id)
        WHERE status IN ('queued', 'failed')""",
    """CREATE INDEX ix_sqlqueue_hot_lease ON sqlqueue_hot (lease_expires_at)
        WHERE status = 'running'""",
    """CREATE TABLE sqlqueue_history (LIKE sqlqueue_hot, finished_at timestamptz NOT NULL)""",
    "CREATE INDEX ix_sqlqueue_history_finished ON sqlqueue_history (finished_at)",
)
_HOT_COMPLETE: Final = """
WITH done AS (
    DELETE FROM sqlqueue_hot
     WHERE (id, attempts) IN (SELECT * FROM unnest(%(ids)s::bigint[], %(attempts)s::int[]))
       AND status = 'running' AND locked_by = %(worker)s
 RETURNING *)
INSERT INTO sqlqueue_history
SELECT id, job_type, queue, priority, payload, 'succeeded', attempts, max_attempts, errors,
       next_run_at, created_at, statement_timestamp(), locked_by, started_at, NULL,
       statement_timestamp()
  FROM done
"""


@dataclass(frozen=True, kw_only=True)
class Layout:
    """One layout: its extra DDL, the table jobs are claimed from, and its statements."""

    name: str
    setup: tuple[str, ...]
    table: str
    claim: str
    complete: str
    insert: str
    #: The claim with its floor (``floor`` and ``timefloor`` only), else None.
    floor_claim: str | None = None
    #: The floor's condition alone (for EXPLAIN), else "".
    floor_condition: str = ""
    #: What the monitor sizes and counts dead rows of (the claim table first).
    tables: tuple[str, ...] = ("sqlqueue_jobs",)


def _layout(name: str, setup: tuple[str, ...] = (), *, floor: str | None = None) -> Layout:
    table = "sqlqueue_jobs"
    return Layout(
        name=name,
        setup=setup,
        table=table,
        claim=_CLAIM.format(table=table, floor=""),
        complete=_COMPLETE,
        insert=_INSERT.format(table=table),
        floor_claim=None if floor is None else _CLAIM.format(table=table, floor=floor),
        floor_condition=floor or "",
    )


LAYOUTS: Final = {
    "today": _layout("today"),
    "fillfactor": _layout("fillfactor", _FILLFACTOR),
    "floor": _layout("floor", floor=_FLOOR),
    "timefloor": _layout("timefloor", floor=_TIME_FLOOR),
    "hot": Layout(
        name="hot",
        setup=_HOT_SCHEMA,
        table="sqlqueue_hot",
        claim=_CLAIM.format(table="sqlqueue_hot", floor=""),
        complete=_HOT_COMPLETE,
        insert=_INSERT.format(table="sqlqueue_hot"),
        tables=("sqlqueue_hot", "sqlqueue_history"),
    ),
}
