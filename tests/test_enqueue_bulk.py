"""Bulk enqueue on each backend's fast path (PostgreSQL COPY, SQLite one JSON-bound statement)
keeps the promises of the row-by-row path: ids in order, idempotency, the caller's transaction,
due times on the database clock, wake-ups; and one-job enqueues sent straight to the driver
still show themselves to SQLAlchemy listeners and get translated errors."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

import sqlqueue
from sqlqueue._schema import jobs
from sqlqueue._store.bulk_copy import COPY_MIN_ROWS
from sqlqueue._store.bulk_json import ROWS_PER_STATEMENT
from sqlqueue.dialects._base import WAKE_CHANNEL
from tests._support import count_jobs, db_now

#: Sizes on both sides of each backend's switch to its bulk path and of SQLite's chunking.
SIZES = [2, COPY_MIN_ROWS - 1, COPY_MIN_ROWS, ROWS_PER_STATEMENT + 7]


def _rows(engine: sa.Engine) -> dict[int, sa.Row[tuple[object, ...]]]:
    with engine.connect() as conn:
        return {row.id: row for row in conn.execute(sa.select(jobs))}


def _queue(backend):
    queue = backend.queue()

    @queue.task("work", queue="main", priority=3, max_attempts=4)
    def work(n: int, text: str = "") -> None:
        pass

    return queue


@pytest.mark.parametrize("size", SIZES)
def test_bulk_enqueue_writes_every_row_and_returns_ids_in_request_order(backend, size):
    queue = _queue(backend)
    with backend.engine.begin() as conn:
        ids = queue.enqueue_many(
            conn,
            [
                sqlqueue.JobRequest(job_type="work", payload={"n": n, "text": "é\n\t\\"})
                for n in range(size)
            ],
        )
    rows = _rows(backend.engine)
    assert len(ids) == len(set(ids)) == len(rows) == size
    assert ids == sorted(ids), "ids grow in request order (per-group ordering relies on it)"
    for n, job_id in enumerate(ids):
        row = rows[job_id]
        assert row.payload == {"n": n, "text": "é\n\t\\"}
        assert (row.job_type, row.queue, row.priority, row.max_attempts) == ("work", "main", 3, 4)
        assert (row.status, row.attempts, row.errors) == ("queued", 0, [])
        assert row.created_at == row.updated_at
        assert row.idempotency_key is None
        assert row.group_key is None


@pytest.mark.parametrize("size", [COPY_MIN_ROWS - 1, 3 * COPY_MIN_ROWS])
def test_bulk_enqueue_mixes_keyed_and_plain_rows_and_writes_each_key_once(backend, size):
    queue = _queue(backend)
    with backend.engine.begin() as conn:
        existing = {
            f"k{n}": queue.enqueue(conn, "work", {"n": -n}, idempotency_key=f"k{n}")
            for n in range(0, 40, 4)
        }
    # Every third request has one of 40 keys (repeated in the batch, some already taken);
    # the rest have none. Options vary per row.
    requests = [
        sqlqueue.JobRequest(
            job_type="work",
            payload={"n": n},
            idempotency_key=f"k{n % 40}" if n % 3 == 0 else None,
            group_key=f"g{n % 5}" if n % 2 else None,
            priority=n % 7,
            queue="main" if n % 4 else "other",
        )
        for n in range(size)
    ]
    with backend.engine.begin() as conn:
        ids = queue.enqueue_many(conn, requests)

    rows = _rows(backend.engine)
    first_with_key: dict[str, int] = {}
    expected_new = 0
    new_ids: list[int] = []
    for index, (request, job_id) in enumerate(zip(requests, ids, strict=True)):
        key = request.idempotency_key
        if key in existing:
            assert job_id == existing[key], "a known key returns the existing job"
            continue
        if key is not None and key in first_with_key:
            assert job_id == ids[first_with_key[key]], "a repeated key gets the first id"
            continue
        if key is not None:
            first_with_key[key] = index
        expected_new += 1
        new_ids.append(job_id)
        row = rows[job_id]
        assert row.payload == request.payload
        assert (row.idempotency_key, row.group_key) == (key, request.group_key)
        assert (row.priority, row.queue) == (request.priority, request.queue)
    assert len(rows) == len(existing) + expected_new
    used = existing.keys() & {request.idempotency_key for request in requests}
    assert len(set(ids)) == len(used) + expected_new
    # Both bulk paths (PostgreSQL COPY, SQLite JSON) write in request order, keyed rows too;
    # multi-row INSERTs (MariaDB/MySQL, and smaller batches) write plain rows before keyed ones.
    if size >= COPY_MIN_ROWS and backend.name != "mysql":
        assert new_ids == sorted(new_ids)


def test_bulk_enqueue_sets_due_times_by_the_database_clock(backend):
    queue = _queue(backend)
    before = db_now(backend.engine)
    run_at = before + timedelta(hours=2, microseconds=123)
    options = [{}, {"delay": 600.5}, {"run_at": run_at}]
    requests = [
        sqlqueue.JobRequest(job_type="work", payload={"n": n}, **options[n % 3])  # type: ignore[arg-type]
        for n in range(COPY_MIN_ROWS + 1)
    ]
    with backend.engine.begin() as conn:
        ids = queue.enqueue_many(conn, requests)
    after = db_now(backend.engine)
    rows = _rows(backend.engine)
    for n, job_id in enumerate(ids):
        row = rows[job_id]
        assert before <= row.created_at <= after
        due = row.next_run_at
        if n % 3 == 0:
            assert due == row.created_at
        elif n % 3 == 1:
            assert abs(due - row.created_at - timedelta(seconds=600.5)) < timedelta(milliseconds=1)
        else:
            assert due == run_at


def test_bulk_enqueue_rolls_back_with_the_callers_transaction(backend):
    queue = _queue(backend)
    requests = [
        sqlqueue.JobRequest(job_type="work", payload={"n": n}, idempotency_key=f"k{n % 2}")
        if n % 10 == 0
        else sqlqueue.JobRequest(job_type="work", payload={"n": n})
        for n in range(2 * COPY_MIN_ROWS)
    ]
    with backend.engine.connect() as conn:
        with conn.begin() as tx:
            queue.enqueue_many(conn, requests)
            tx.rollback()
        assert count_jobs(backend.engine) == 0
        with conn.begin():  # the same connection (and its staging table, if any) again
            ids = queue.enqueue_many(conn, requests)
    keys = {request.idempotency_key for request in requests} - {None}
    plain = sum(request.idempotency_key is None for request in requests)
    assert count_jobs(backend.engine) == len(set(ids)) == plain + len(keys)


def test_two_bulk_enqueues_in_one_transaction_share_their_keys(backend):
    queue = _queue(backend)
    first = [
        sqlqueue.JobRequest(job_type="work", payload={"n": n}, idempotency_key=f"k{n}")
        for n in range(COPY_MIN_ROWS)
    ]
    second = [
        sqlqueue.JobRequest(job_type="work", payload={"n": n}, idempotency_key=f"k{n}")
        for n in range(COPY_MIN_ROWS // 2, COPY_MIN_ROWS + COPY_MIN_ROWS // 2)
    ]
    with backend.engine.begin() as conn:
        first_ids = queue.enqueue_many(conn, first)
        second_ids = queue.enqueue_many(conn, second)
    half = COPY_MIN_ROWS // 2
    assert second_ids[:half] == first_ids[half:]
    assert not set(second_ids[half:]) & set(first_ids)
    assert count_jobs(backend.engine) == COPY_MIN_ROWS + half


def test_bulk_enqueue_wakes_workers_once_per_queue(backend):
    backend.requires("listen_notify")
    queue = _queue(backend)
    requests = [
        sqlqueue.JobRequest(job_type="work", payload={"n": n}, queue=f"q{n % 2}")
        for n in range(COPY_MIN_ROWS * 2)
    ]
    with queue.dialect.listen(backend.engine, WAKE_CHANNEL) as wait:
        with backend.engine.begin() as conn:
            queue.enqueue_many(conn, requests)
        woken: list[str] = []
        deadline = time.monotonic() + 5
        while len(woken) < 2 and time.monotonic() < deadline:
            woken.extend(wait(0.2))
        woken.extend(wait(0.2))  # and nothing more
    assert sorted(woken) == ["q0", "q1"]


def test_bulk_enqueue_through_an_async_connection(backend):
    queue = _queue(backend)
    url = backend.engine.url
    async_url = queue.dialect.async_url(url).render_as_string(hide_password=False)

    async def scenario() -> list[int]:
        engine = create_async_engine(async_url)
        try:
            async with engine.begin() as conn:
                ids: list[int] = await queue.enqueue_many_async(
                    conn,
                    [
                        sqlqueue.JobRequest(job_type="work", payload={"n": n})
                        for n in range(COPY_MIN_ROWS + 5)
                    ],
                )
            return ids
        finally:
            await engine.dispose()

    ids = asyncio.run(scenario())
    rows = _rows(backend.engine)
    assert [rows[job_id].payload for job_id in ids] == [{"n": n} for n in range(len(ids))]


def test_one_job_enqueues_show_themselves_to_sqlalchemy_listeners(backend):
    queue = _queue(backend)
    seen: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        seen.append(statement)

    sa.event.listen(backend.engine, "before_cursor_execute", record)
    try:
        with backend.engine.begin() as conn:
            job_id = queue.enqueue(conn, "work", {"n": 1})
            keyed = queue.enqueue(conn, "work", {"n": 2}, idempotency_key="k")
            again = queue.enqueue(conn, "work", {"n": 3}, idempotency_key="k")
    finally:
        sa.event.remove(backend.engine, "before_cursor_execute", record)
    assert sum("INSERT INTO sqlqueue_jobs" in statement for statement in seen) == 3
    assert job_id != keyed == again
    assert count_jobs(backend.engine) == 2


@pytest.mark.parametrize("size", [1, COPY_MIN_ROWS])
def test_enqueue_errors_from_every_path_are_translated(backend, size):
    queue = _queue(backend)
    with backend.engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE sqlqueue_jobs"))
    requests = [sqlqueue.JobRequest(job_type="work", payload={"n": n}) for n in range(size)]
    with (
        pytest.raises(sqlqueue.SchemaNotMigrated, match="run `sqlqueue migrate`"),
        backend.engine.begin() as conn,
    ):
        queue.enqueue_many(conn, requests)


def test_a_copy_the_server_rejects_gives_a_translated_error(postgres_url):
    """PostgreSQL: an error inside COPY comes out as sqlqueue's, like an INSERT's would."""
    engine = sa.create_engine(postgres_url)
    try:
        with engine.begin() as conn:  # the session's database, as other tests left it
            for table in sa.inspect(conn).get_table_names():
                conn.execute(sa.text(f'DROP TABLE "{table}" CASCADE'))
        sqlqueue.migrate(engine)
        # A rule of the server's own that sqlqueue cannot know (every value sqlqueue can check
        # is refused before COPY starts).
        with engine.begin() as conn:
            conn.execute(
                sa.text("ALTER TABLE sqlqueue_jobs ADD CONSTRAINT server_rule CHECK (queue <> 'x')")
            )
        queue = sqlqueue.Queue(engine)
        requests = [
            sqlqueue.JobRequest(job_type="t", queue="x", external=True)
            for _ in range(COPY_MIN_ROWS)
        ]
        with (
            pytest.raises(sqlqueue.DatabaseError, match="server_rule"),
            engine.begin() as conn,
        ):
            queue.enqueue_many(conn, requests)
        assert count_jobs(engine) == 0
    finally:
        engine.dispose()
