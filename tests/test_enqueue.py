"""Enqueue writes in the caller's transaction, in bulk, and once per idempotency key."""

from __future__ import annotations

import asyncio
from contextlib import contextmanager
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session, scoped_session, sessionmaker

import sqlqueue
from sqlqueue._enqueue import _ADAPTERS, register_connection_type
from sqlqueue._schema import jobs
from sqlqueue._store._direct import DirectStatement
from sqlqueue.dialects import dialect_for
from tests._support import count_jobs, db_now, drain

users = sa.Table(
    "app_users",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("email", sa.String(100)),
)


def _queue_with_welcome(backend):
    queue = backend.queue()

    @queue.task("welcome", queue="mail")
    def welcome(user_id: int) -> None:
        pass

    users.create(backend.engine)
    return queue, welcome


def test_job_is_written_in_the_callers_transaction_and_rolls_back_with_it(backend):
    queue, welcome = _queue_with_welcome(backend)
    with backend.engine.connect() as conn, conn.begin() as tx:
        conn.execute(users.insert().values(id=1, email="a@example.com"))
        job_id = welcome.enqueue(conn, user_id=1)
        tx.rollback()
    assert queue.get_job(job_id) is None
    assert count_jobs(backend.engine) == 0


def test_job_is_invisible_to_workers_until_commit(backend):
    queue, welcome = _queue_with_welcome(backend)
    with backend.engine.connect() as conn, conn.begin():
        conn.execute(users.insert().values(id=1, email="a@example.com"))
        job_id = welcome.enqueue(conn, user_id=1)
        # Another connection (a worker's) cannot see it yet.
        assert queue.get_job(job_id) is None
        if backend.capable("row_locks"):  # SQLite: the enqueue holds the write lock
            claimed = queue.store.claim(
                queues=["mail"], job_types=None, limit=10, worker_id="w", lease_seconds=30
            )
            assert claimed == []
    job = queue.get_job(job_id)
    assert job is not None
    assert job.status == "queued"
    assert job.queue == "mail"
    assert job.payload == {"user_id": 1}


def test_orm_session_enqueue_commits_and_rolls_back_with_the_session(backend):
    queue, welcome = _queue_with_welcome(backend)
    with Session(backend.engine) as session:
        session.execute(users.insert().values(id=1, email="a@example.com"))
        rolled_back = welcome.enqueue(session, user_id=1)
        session.rollback()
        session.execute(users.insert().values(id=2, email="b@example.com"))
        kept = queue.enqueue(session, "welcome", {"user_id": 2})
        session.commit()
    assert count_jobs(backend.engine) == 1  # SQLite may reuse the rolled-back rowid
    assert rolled_back == kept or queue.get_job(rolled_back) is None
    job = queue.get_job(kept)
    assert job is not None
    assert job.payload == {"user_id": 2}
    with backend.engine.connect() as conn:
        assert conn.execute(sa.select(users.c.id)).scalars().all() == [2]


def _async_url(backend) -> str:
    url = dialect_for(backend.engine).async_url(sa.make_url(backend.url))
    return url.render_as_string(hide_password=False)


def test_async_connection_and_async_session_enqueue(backend):
    queue, welcome = _queue_with_welcome(backend)

    async def scenario() -> tuple[int, int, int]:
        engine = create_async_engine(_async_url(backend))
        try:
            async with engine.connect() as conn:
                await conn.begin()
                dropped = await welcome.enqueue_async(conn, user_id=9)
                await conn.rollback()
            async with engine.begin() as conn:
                first = await queue.enqueue_async(conn, "welcome", {"user_id": 1})
            async with AsyncSession(engine) as session:
                second = await welcome.enqueue_async(session, user_id=2)
                await session.commit()
            return dropped, first, second
        finally:
            await engine.dispose()

    dropped, first, second = asyncio.run(scenario())
    assert count_jobs(backend.engine) == 2
    assert dropped in (first, second) or queue.get_job(dropped) is None
    assert [queue.get_job(first).payload, queue.get_job(second).payload] == [
        {"user_id": 1},
        {"user_id": 2},
    ]


def test_enqueue_many_inserts_thousands_and_returns_ids_in_order(backend):
    _, welcome = _queue_with_welcome(backend)
    with backend.engine.begin() as conn:
        ids = welcome.enqueue_many(conn, [{"user_id": n} for n in range(5000)])
    assert len(ids) == len(set(ids)) == 5000
    with backend.engine.connect() as conn:
        rows = conn.execute(sa.select(jobs.c.id, jobs.c.payload)).all()
    payloads = {job_id: payload for job_id, payload in rows}
    assert [payloads[job_id] for job_id in ids] == [{"user_id": n} for n in range(5000)]


def test_enqueue_many_with_keys_dedups_within_the_batch_and_against_existing_jobs(backend):
    queue, _ = _queue_with_welcome(backend)
    with backend.engine.begin() as conn:
        existing = queue.enqueue(conn, "welcome", {"user_id": 0}, idempotency_key="k0")
    requests = [
        sqlqueue.JobRequest(job_type="welcome", payload={"user_id": 0}, idempotency_key="k0"),
        sqlqueue.JobRequest(job_type="welcome", payload={"user_id": 1}, idempotency_key="k1"),
        sqlqueue.JobRequest(job_type="welcome", payload={"user_id": 2}),
        sqlqueue.JobRequest(job_type="welcome", payload={"user_id": 1}, idempotency_key="k1"),
    ]
    with backend.engine.begin() as conn:
        ids = queue.enqueue_many(conn, requests)
    assert ids[0] == existing
    assert ids[1] == ids[3] != ids[2]
    assert count_jobs(backend.engine) == 3


def test_idempotency_key_returns_the_first_job_whatever_its_status(backend):
    queue = backend.queue()

    @queue.task("once", max_attempts=1)
    def once(fail: bool) -> None:
        if fail:
            raise ValueError("no")

    with backend.engine.begin() as conn:
        ok = once.options(idempotency_key="ok").enqueue(conn, fail=False)
        bad = once.options(idempotency_key="bad").enqueue(conn, fail=True)
    drain(queue)
    assert queue.get_job(ok).status == "succeeded"
    assert queue.get_job(bad).status == "dead"
    with backend.engine.begin() as conn:
        assert once.options(idempotency_key="ok").enqueue(conn, fail=False) == ok
        assert queue.enqueue(conn, "once", {"fail": False}, idempotency_key="bad") == bad
    assert count_jobs(backend.engine) == 2


def test_a_rolled_back_key_can_be_used_by_a_later_transaction(backend):
    queue, welcome = _queue_with_welcome(backend)
    with backend.engine.connect() as conn, conn.begin() as tx:
        first = welcome.options(idempotency_key="welcome:1").enqueue(conn, user_id=1)
        tx.rollback()
    with backend.engine.begin() as conn:
        second = welcome.options(idempotency_key="welcome:1").enqueue(conn, user_id=1)
    assert count_jobs(backend.engine) == 1
    assert first == second or queue.get_job(first) is None
    assert queue.get_job(second).idempotency_key == "welcome:1"


def test_delay_and_run_at_set_the_due_time_by_the_database_clock(backend):
    queue, welcome = _queue_with_welcome(backend)
    before = db_now(backend.engine)
    run_at = before + timedelta(hours=2)
    with backend.engine.begin() as conn:
        delayed = welcome.options(delay=600).enqueue(conn, user_id=1)
        scheduled = welcome.options(run_at=run_at).enqueue(conn, user_id=2)
        now = welcome.enqueue(conn, user_id=3)
    after = db_now(backend.engine)
    due = queue.get_job(delayed).next_run_at
    assert before + timedelta(seconds=600) <= due <= after + timedelta(seconds=600)
    assert queue.get_job(scheduled).next_run_at == run_at
    assert before <= queue.get_job(now).next_run_at <= after
    # Only the job due now is claimed.
    claimed = queue.store.claim(
        queues=["mail"], job_types=None, limit=10, worker_id="w", lease_seconds=30
    )
    assert [job.id for job in claimed] == [now]
    later = queue.store.claim(
        queues=["mail"],
        job_types=None,
        limit=10,
        worker_id="w",
        lease_seconds=30,
        now=after + timedelta(seconds=601),
    )
    assert [job.id for job in later] == [delayed]


def test_per_job_options_override_the_task_defaults(backend):
    queue = backend.queue()

    @queue.task("report", queue="reports", priority=5, max_attempts=3)
    def report(n: int) -> None:
        pass

    with backend.engine.begin() as conn:
        default = report.enqueue(conn, n=1)
        custom = report.options(queue="urgent", priority=-1, max_attempts=9).enqueue(conn, n=2)
    job = queue.get_job(default)
    assert (job.queue, job.priority, job.max_attempts, job.attempts) == ("reports", 5, 3, 0)
    job = queue.get_job(custom)
    assert (job.queue, job.priority, job.max_attempts) == ("urgent", -1, 9)


def test_an_engine_gets_a_transaction_of_its_own(backend):
    queue, welcome = _queue_with_welcome(backend)
    job_id = welcome.enqueue(backend.engine, user_id=1)
    assert queue.get_job(job_id).status == "queued"


def test_a_scoped_session_enqueues_in_its_current_session_s_transaction(backend):
    # Flask-SQLAlchemy's db.session is a scoped_session: the job commits or rolls back with
    # the session the scope holds.
    queue, welcome = _queue_with_welcome(backend)
    scoped = scoped_session(sessionmaker(backend.engine))
    welcome.enqueue(scoped, user_id=1)
    scoped.rollback()
    assert count_jobs(backend.engine) == 0
    kept = welcome.enqueue(scoped, user_id=2)
    scoped.commit()
    scoped.remove()
    assert queue.get_job(kept).payload == {"user_id": 2}
    assert count_jobs(backend.engine) == 1


def test_enqueue_writes_through_a_registered_connection_type(backend):
    # What sqlqueue.django does for Django's connections, without the core knowing Django.
    class Handle:
        def __init__(self, conn):
            self.conn = conn

    @contextmanager
    def through(handle):
        yield handle.conn

    queue, welcome = _queue_with_welcome(backend)
    register_connection_type(Handle, through)
    try:
        with backend.engine.connect() as conn:
            job_id = welcome.enqueue(Handle(conn), user_id=1)
            conn.rollback()
        assert queue.get_job(job_id) is None
    finally:
        del _ADAPTERS[Handle]


@pytest.mark.parametrize("target", [None, "not a connection", 42])
def test_enqueue_needs_a_connection_session_or_engine(backend, target):
    queue, _ = _queue_with_welcome(backend)
    with pytest.raises(
        sqlqueue.ConfigurationError, match="pass a SQLAlchemy Connection or Session"
    ):
        queue.enqueue(target, "welcome", {"user_id": 1})


def _enqueue_each_kind(queue, conn, run_at):
    """One job of each shape a one-job enqueue takes: due now or later, with a key or not."""
    return [
        queue.enqueue(conn, "welcome", {"user_id": 1}),
        queue.enqueue(conn, "welcome", {"user_id": 2}, delay=0),
        queue.enqueue(conn, "welcome", {"user_id": 3}, idempotency_key="now", group_key="g"),
        queue.enqueue(conn, "welcome", {"user_id": 4}, delay=90.5, priority=-7),
        queue.enqueue(conn, "welcome", {"user_id": 5}, run_at=run_at, idempotency_key="at"),
    ]


def _stored(engine, ids):
    """Jobs ``ids`` as stored, with each due time relative to the job's creation."""
    with engine.connect() as conn:
        rows = {row.id: row for row in conn.execute(sa.select(jobs).where(jobs.c.id.in_(ids)))}
    return [
        (
            row.job_type,
            row.queue,
            row.priority,
            row.payload,
            row.status,
            row.attempts,
            row.max_attempts,
            row.errors,
            row.idempotency_key,
            row.group_key,
            row.updated_at == row.created_at,
            row.next_run_at - row.created_at,
        )
        for row in (rows[job_id] for job_id in ids)
    ]


def test_one_job_enqueue_writes_the_same_rows_with_or_without_listeners(backend, monkeypatch):
    """With nothing listening, a one-job enqueue goes straight to the driver; a listener on the
    connection itself sends it through SQLAlchemy. Both write the same rows, and a job due now
    (no delay, or a delay of 0) is due at its creation time."""
    queue, _ = _queue_with_welcome(backend)
    run_at = db_now(backend.engine) + timedelta(days=1)
    direct_runs: list[str] = []
    first_row = DirectStatement.first_row

    def counted(self, conn, values, schema=None):
        direct_runs.append(values["job_type"])
        return first_row(self, conn, values, schema)

    monkeypatch.setattr(DirectStatement, "first_row", counted)
    seen: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        seen.append(statement)

    # Where RETURNING is emulated in several statements, nothing goes to the driver directly.
    direct_expected = 0 if dialect_for(backend.engine).emulates_returning else 5
    with backend.engine.begin() as conn:
        direct_ids = _enqueue_each_kind(queue, conn, run_at)
    assert len(direct_runs) == direct_expected
    direct = _stored(backend.engine, direct_ids)
    assert queue.get_job(direct_ids[4]).next_run_at == run_at
    with backend.engine.begin() as conn:
        conn.execute(sa.delete(jobs))  # frees the idempotency keys
        sa.event.listen(conn, "before_cursor_execute", record)  # this connection only
        listened_ids = _enqueue_each_kind(queue, conn, run_at)
    assert len(direct_runs) == direct_expected
    assert sum("INSERT INTO sqlqueue_jobs" in statement for statement in seen) == 5
    listened = _stored(backend.engine, listened_ids)
    assert queue.get_job(listened_ids[4]).next_run_at == run_at
    assert [row[:-1] for row in listened] == [row[:-1] for row in direct]
    for rows in (direct, listened):
        assert [row[-1] for row in rows[:4]] == [timedelta(0)] * 3 + [timedelta(seconds=90.5)]
