"""Every value that reaches a column is held to that column's limits before any SQL is sent.

The limits come from the schema (``sqlqueue/_limits.py`` reads ``sqlqueue/_schema.py``): a
queue name longer than its column, a priority or attempt count beyond the column's integer
type, a run time past what MariaDB's DATETIME holds, a NUL in any text. Each gets a typed
error naming the field and the limit, no statement reaches the database (an event counter
says so), the caller's transaction stays usable, and the jobs table is as it was.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._limits import LATEST, integer_range, text_length
from sqlqueue._schema import jobs
from tests._support import count_jobs

INT_MAX = 2**31 - 1


@contextmanager
def no_sql(engine: sa.Engine) -> Iterator[list[str]]:
    """Fail if any statement is sent on ``engine`` inside the block."""
    sent: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    sa.event.listen(engine, "before_cursor_execute", count)
    try:
        yield sent
    finally:
        sa.event.remove(engine, "before_cursor_execute", count)
    assert sent == [], f"SQL was sent for a refused call: {sent}"


def snapshot(engine: sa.Engine) -> list[tuple[Any, ...]]:
    """Every job row, in id order: what "nothing lost or changed" compares."""
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(sa.select(jobs).order_by(jobs.c.id))]


def _job(queue: sqlqueue.Queue, job_id: int) -> sqlqueue.Job:
    job = queue.get_job(job_id)
    assert job is not None, f"job {job_id} is gone"
    return job


def _queue(backend: Any) -> tuple[sqlqueue.Queue, sqlqueue.Task]:
    queue = backend.queue()

    @queue.task("t")
    def t(**payload: object) -> None:
        pass

    return queue, t


def test_the_limits_are_the_schemas():
    assert text_length(jobs.c.queue) == 100
    assert text_length(jobs.c.job_type) == 200
    assert text_length(jobs.c.idempotency_key) == 255
    assert text_length(jobs.c.last_error) is None
    assert integer_range(jobs.c.priority) == (-(2**31), INT_MAX)
    assert integer_range(jobs.c.id) == (-(2**63), 2**63 - 1)


BAD_OPTIONS = [
    pytest.param({"queue": "q" * 101}, "queue is 101 characters long; at most 100", id="queue"),
    pytest.param({"queue": "ma\x00il"}, "queue contains a NUL character", id="queue-nul"),
    pytest.param({"queue": "\ud800"}, "queue is not valid Unicode", id="queue-surrogate"),
    pytest.param({"queue": 5}, "queue must be a string, got int", id="queue-int"),
    pytest.param({"idempotency_key": "k\x00"}, "idempotency_key contains a NUL", id="key-nul"),
    pytest.param({"idempotency_key": "k" * 256}, "at most 255", id="key-long"),
    pytest.param({"group_key": "\x00"}, "group_key contains a NUL", id="group-nul"),
    pytest.param({"group_key": "g" * 256}, "at most 255", id="group-long"),
    pytest.param({"priority": "high"}, "priority must be an integer, got str", id="prio-str"),
    pytest.param({"priority": 1.5}, "priority must be an integer, got float", id="prio-float"),
    pytest.param({"priority": True}, "priority must be an integer, got bool", id="prio-bool"),
    pytest.param({"priority": 2**31}, "priority must be between -1000000 and", id="prio-big"),
    pytest.param(
        {"max_attempts": 2**31}, "max_attempts must be between 1 and 2147483647", id="attempts"
    ),
    pytest.param({"max_attempts": 2.0}, "max_attempts must be an integer", id="attempts-float"),
    pytest.param({"delay": 1e12}, "puts the job after 9999-12-31", id="delay-overflow"),
    pytest.param({"delay": "5"}, "delay must be a number of seconds, got str", id="delay-str"),
    pytest.param({"delay": float("nan")}, "delay must be >= 0", id="delay-nan"),
    pytest.param(
        {"run_at": datetime(999, 12, 31, tzinfo=UTC)}, "run_at must be between", id="run-at-early"
    ),
    pytest.param(
        {"run_at": datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-2)))},
        "run_at must be between",
        id="run-at-overflows-utc",
    ),
]


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS)
def test_an_option_beyond_its_column_is_refused_before_any_sql(backend, options, message):
    queue, t = _queue(backend)
    with backend.engine.begin() as conn:
        t.enqueue(conn, n=0)
    before = snapshot(backend.engine)

    with backend.engine.connect() as conn, conn.begin():
        with no_sql(backend.engine), pytest.raises(sqlqueue.EnqueueError, match=message):
            t.options(**options).enqueue(conn, n=1)
        with no_sql(backend.engine), pytest.raises(sqlqueue.EnqueueError, match=message):
            queue.enqueue_many(
                conn,
                [
                    sqlqueue.JobRequest(job_type="t", payload={"n": 2}),
                    sqlqueue.JobRequest(job_type="t", payload={"n": 3}, **options),
                ],
            )
        if "idempotency_key" not in options:  # a batch's children take none at all
            with no_sql(backend.engine), pytest.raises(sqlqueue.EnqueueError, match=message):
                queue.enqueue_batch(conn, [sqlqueue.JobRequest(job_type="t", **options)])
        # The transaction is still usable: write in it and commit.
        good = t.enqueue(conn, n=4)

    assert snapshot(backend.engine)[:-1] == before
    assert _job(queue, good).payload == {"n": 4}


@pytest.mark.parametrize(
    ("job_type", "message"),
    [
        pytest.param("t\x00", "job_type contains a NUL character", id="nul"),
        pytest.param("t" * 201, "job_type is 201 characters long; at most 200", id="long"),
        pytest.param("", "job_type must not be empty", id="empty"),
        pytest.param(["t"], "job_type must be a string, got list", id="list"),
    ],
)
def test_a_job_type_beyond_its_column_is_refused_even_for_external_jobs(backend, job_type, message):
    queue, _ = _queue(backend)
    with (
        backend.engine.connect() as conn,
        conn.begin(),
        no_sql(backend.engine),
        pytest.raises(sqlqueue.EnqueueError, match=message),
    ):
        queue.enqueue(conn, job_type, {}, external=True)
    assert count_jobs(backend.engine) == 0


def test_the_limits_themselves_are_accepted_and_read_back(backend):
    queue, t = _queue(backend)
    run_at = datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC)
    with backend.engine.begin() as conn:
        job_id = t.options(
            queue="q" * 100,
            idempotency_key="k" * 254 + "\U0001f600",
            group_key="g\u2028\x85 ",
            priority=-1_000_000,
            max_attempts=INT_MAX,
            run_at=run_at,
        ).enqueue(conn)
        soon = t.options(delay=(LATEST - datetime.now(UTC)).total_seconds() - 2 * 86_400).enqueue(
            conn
        )
    job = _job(queue, job_id)
    assert (job.queue, job.idempotency_key, job.group_key) == (
        "q" * 100,
        "k" * 254 + "\U0001f600",
        "g\u2028\x85 ",
    )
    assert (job.priority, job.max_attempts, job.next_run_at) == (-1_000_000, INT_MAX, run_at)
    assert _job(queue, soon).next_run_at.year == 9999


def test_async_enqueue_refuses_before_any_sql(backend):
    pytest.importorskip("sqlalchemy.ext.asyncio")
    queue, _ = _queue(backend)

    async def main() -> None:
        engine = queue.async_engine()
        try:
            async with engine.begin() as conn:
                with no_sql(backend.engine), pytest.raises(sqlqueue.EnqueueError, match="NUL"):
                    await queue.enqueue_async(conn, "t", {}, group_key="a\x00")
                with pytest.raises(sqlqueue.EnqueueError, match="priority"):
                    await queue.enqueue_many_async(
                        conn,
                        [sqlqueue.JobRequest(job_type="t", priority=1.5)],  # type: ignore[arg-type]
                    )
                await queue.enqueue_async(conn, "t", {"ok": True})
        finally:
            await engine.dispose()

    asyncio.run(main())
    assert count_jobs(backend.engine) == 1


# -- declarations ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        pytest.param({"queue": "q" * 101}, "queue is 101 characters long", id="queue"),
        pytest.param({"queue": "a\x00"}, "queue contains a NUL", id="queue-nul"),
        pytest.param({"priority": 2**40}, "priority must be between", id="priority"),
        pytest.param({"priority": "1"}, "priority must be an integer", id="priority-str"),
        pytest.param({"max_attempts": 2**31}, "max_attempts must be between", id="attempts"),
    ],
)
def test_a_task_declared_beyond_its_columns_fails_at_declaration(backend, options, message):
    queue = backend.queue()
    with pytest.raises(sqlqueue.ConfigurationError, match=message):
        queue.task("t", **options)(lambda: None)
    with pytest.raises(sqlqueue.ConfigurationError, match=message):
        queue.periodic("0 3 * * *", "nightly", **options)(lambda: None)
    assert queue.tasks == {}
    assert queue.periodic_schedules == ()


def test_a_task_name_or_default_queue_beyond_its_column_fails_at_declaration(backend):
    queue = backend.queue()
    with pytest.raises(sqlqueue.ConfigurationError, match="task name is 201 characters"):
        queue.task("t" * 201)(lambda: None)
    with pytest.raises(sqlqueue.ConfigurationError, match="task name contains a NUL"):
        queue.task("t\x00")(lambda: None)
    with pytest.raises(sqlqueue.ConfigurationError, match="default_queue is 101 characters"):
        backend.queue(default_queue="d" * 101)


# -- idempotency keys compare exactly ------------------------------------------------------------


def test_keys_differing_only_in_trailing_spaces_are_two_jobs(backend):
    queue, t = _queue(backend)
    with backend.engine.begin() as conn:
        plain = t.options(idempotency_key="k").enqueue(conn, n=1)
        spaced = t.options(idempotency_key="k ").enqueue(conn, n=2)
        upper = t.options(idempotency_key="K").enqueue(conn, n=3)
    with backend.engine.begin() as conn:
        again = t.options(idempotency_key="k").enqueue(conn, n=4)
        again_spaced = t.options(idempotency_key="k ").enqueue(conn, n=5)
        bulk = queue.enqueue_many(
            conn,
            [
                sqlqueue.JobRequest(job_type="t", idempotency_key="k  "),
                sqlqueue.JobRequest(job_type="t", idempotency_key="k "),
                sqlqueue.JobRequest(job_type="t", idempotency_key="k"),
            ],
        )
    assert len({plain, spaced, upper}) == 3
    assert (again, again_spaced) == (plain, spaced)
    assert bulk[1:] == [spaced, plain]
    assert bulk[0] not in {plain, spaced, upper}
    assert _job(queue, spaced).idempotency_key == "k "
    assert _job(queue, spaced).payload == {"n": 2}
    assert count_jobs(backend.engine) == 4


# -- operators' filters and actions ----------------------------------------------------------------


def _dead_job(backend: Any) -> tuple[sqlqueue.Queue, int]:
    queue = backend.queue()

    @queue.task("boom", max_attempts=1)
    def boom() -> None:
        raise ValueError("it broke")

    with backend.engine.begin() as conn:
        job_id = boom.enqueue(conn)
    queue.worker(poll_interval=0.02).run(burst=True)
    assert _job(queue, job_id).status == "dead"
    return queue, job_id


FILTERS = [
    pytest.param({"error_contains": "\x00"}, "error_contains contains a NUL", id="error-nul"),
    pytest.param({"error_contains": "\udfff"}, "error_contains is not valid", id="error-surr"),
    pytest.param({"job_type": "boom\x00"}, "job_type contains a NUL", id="type-nul"),
    pytest.param({"queue": "x" * 101}, "queue is 101 characters long", id="queue-long"),
    pytest.param({"job_ids": [2**63]}, "job_ids must be between 0 and", id="id-big"),
    pytest.param({"job_ids": ["x"]}, "job_ids must be an integer", id="id-text"),
    pytest.param({"job_ids": [1.5]}, "job_ids must be an integer", id="id-float"),
    pytest.param(
        {"since": datetime(1, 1, 1, tzinfo=UTC)}, "since must be between", id="since-early"
    ),
]


@pytest.mark.parametrize(("where", "message"), FILTERS)
def test_an_operators_filter_beyond_its_column_is_refused_before_any_sql(backend, where, message):
    queue, dead = _dead_job(backend)
    before = snapshot(backend.engine)
    with no_sql(backend.engine):
        with pytest.raises(sqlqueue.ConfigurationError, match=message):
            queue.jobs(**where)
        with pytest.raises(sqlqueue.ConfigurationError, match=message):
            queue.requeue_where(by="ops", reason="retry", **where)
        with pytest.raises(sqlqueue.ConfigurationError, match=message):
            queue.discard_where(by="ops", reason="noise", **where)
        if "error_contains" not in where and "since" not in where:
            with pytest.raises(sqlqueue.ConfigurationError, match=message):
                queue.retry_now(**where)
    assert snapshot(backend.engine) == before
    assert [job.id for job in queue.jobs(status="dead")] == [dead]


def test_a_nul_in_error_contains_no_longer_matches_every_job(backend):
    queue, dead = _dead_job(backend)
    with pytest.raises(sqlqueue.ConfigurationError, match="NUL"):
        queue.jobs(error_contains="\x00")
    assert queue.jobs(error_contains="it broke")[0].id == dead
    assert queue.jobs(error_contains="nothing like it") == []


def test_operators_actions_are_held_to_their_columns(backend):
    queue, dead = _dead_job(backend)
    before = snapshot(backend.engine)
    with no_sql(backend.engine):
        with pytest.raises(sqlqueue.ConfigurationError, match="requeue: by is 256 characters"):
            queue.requeue(dead, by="o" * 256, reason="x")
        with pytest.raises(sqlqueue.ConfigurationError, match="discard: reason contains a NUL"):
            queue.discard(dead, by="ops", reason="a\x00")
        with pytest.raises(sqlqueue.ConfigurationError, match="job_id must be between"):
            queue.requeue(2**64, by="ops", reason="x")
        with pytest.raises(sqlqueue.ConfigurationError, match="job_id must be an integer"):
            queue.cancel("1")  # type: ignore[arg-type]
        with pytest.raises(sqlqueue.ConfigurationError, match="job_id must be between"):
            queue.get_job(2**70)
        with pytest.raises(sqlqueue.ConfigurationError, match="batch_id must be an integer"):
            queue.get_batch("7")  # type: ignore[arg-type]
        with pytest.raises(sqlqueue.ConfigurationError, match="queue name is 101 characters"):
            queue.pause("q" * 101, by="ops", reason="x")
        with pytest.raises(sqlqueue.ConfigurationError, match="queue name contains a NUL"):
            queue.resume("q\x00")
        with pytest.raises(sqlqueue.ConfigurationError, match="group_key contains a NUL"):
            queue.cancel_where(group_key="\x00")
        with pytest.raises(
            sqlqueue.ConfigurationError,
            match=r"older_than=1e\+20 seconds reaches before 1000-01-01",
        ):
            queue.prune(older_than=1e20, statuses=["dead"])
    assert snapshot(backend.engine) == before


def test_the_web_page_answers_400_for_a_filter_beyond_its_column(backend):
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from sqlqueue.web import create_app

    queue, _ = _dead_job(backend)
    client = TestClient(create_app(queue), base_url="http://localhost")
    response = client.get("/jobs", params={"queue": "q" * 101})
    assert response.status_code == 400
    assert "queue is 101 characters long" in response.text
    assert client.get("/jobs", params={"queue": "default"}).status_code == 200


def test_the_cli_refuses_a_filter_beyond_its_column_as_a_usage_error(backend):
    # A byte that is not UTF-8 reaches Python's argv as a lone surrogate ("\udcff").
    env = {k: v for k, v in os.environ.items() if k != "SQLQUEUE_DATABASE_URL"}
    env["SQLQUEUE_DATABASE_URL"] = backend.url
    for args, message in (
        ([b"jobs", b"list", b"--type", b"\xff"], "job_type is not valid Unicode"),
        ([b"jobs", b"list", b"--queue", b"q" * 101], "queue is 101 characters long"),
        ([b"dead", b"list", b"--error-contains", b"\xfe"], "error_contains is not valid"),
    ):
        result = subprocess.run(
            [os.fsencode(sys.executable), b"-m", b"sqlqueue", *args],
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )
        stderr = result.stderr.decode("utf-8", "replace")
        assert result.returncode == 2, stderr
        assert message in stderr
        assert "Traceback" not in stderr
