"""Which indexes a plain job's row enters at each status change, asked of the database.

On PostgreSQL an update that changes an indexed column (every status change does: ``status``
is in the claim, lease and status indexes) writes a new entry into every index of the table
whose predicate the new row meets: the cost of the hot path in WAL and page writes. A plain job
(no group, idempotency, unique or limit key, no batch, no expiry) should enter only the indexes
that some query reads it by. SQLite's partial indexes follow the same rule. MariaDB/MySQL have
no partial indexes, and InnoDB writes a secondary index only when its own columns change.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import jobs
from sqlqueue.testing import drain

#: The indexes a plain job's row is in once it is running, and once it has succeeded.
RUNNING = {"pk_sqlqueue_jobs", "ix_sqlqueue_jobs_lease", "ix_sqlqueue_jobs_status"}
SUCCEEDED = {"pk_sqlqueue_jobs", "ix_sqlqueue_jobs_status", "ix_sqlqueue_jobs_finished"}
#: Full today: old releases' ``ON CONFLICT (idempotency_key)`` names no predicate, so a partial
#: index would fail their enqueues during a rolling upgrade.
ALSO = {"uq_sqlqueue_jobs_idempotency_key"}


def _entered(conn: sa.Connection, job_id: int) -> set[str]:
    """The indexes of ``sqlqueue_jobs`` on this database whose predicate the row ``job_id``
    meets now (the predicates as declared, which the migrations are tested to create)."""
    dialect = conn.dialect.name
    present = {index["name"] for index in sa.inspect(conn).get_indexes(jobs.name)}
    names = {"pk_sqlqueue_jobs"}
    for index in jobs.indexes:
        if index.name not in present:
            continue
        where: Any = index.dialect_options[dialect]["where"]
        query = sa.select(sa.func.count()).select_from(jobs).where(jobs.c.id == job_id)
        if conn.execute(query if where is None else query.where(where)).scalar_one():
            names.add(str(index.name))
    return names


def test_a_plain_jobs_claim_and_completion_enter_only_the_indexes_that_read_it(backend):
    backend.requires("partial_indexes")
    queue = backend.queue()
    seen: dict[str, set[str]] = {}

    @queue.task("plain")
    def plain(ctx: sqlqueue.JobContext) -> None:
        with backend.engine.connect() as conn:
            seen["running"] = _entered(conn, ctx.job_id)

    with backend.engine.begin() as conn:
        job_id = plain.enqueue(conn)
    drain(queue)
    with backend.engine.connect() as conn:
        seen["succeeded"] = _entered(conn, job_id)
    assert seen == {"running": RUNNING | ALSO, "succeeded": SUCCEEDED | ALSO}
