"""The handler's context: job facts, transactional completion, results and progress."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import sqlqueue
from sqlqueue.testing import age_jobs
from sqlqueue.testing import drain as drain_in_this_process
from tests._support import WorkerThread, db_now, drain, wait_until

ROOT = Path(__file__).resolve().parent.parent

notes = sa.Table(
    "notes",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("job_id", sa.Integer, nullable=False),
    sa.Column("text", sa.String(100), nullable=False),
)


def _notes(engine: sa.Engine) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        return [tuple(row) for row in conn.execute(sa.select(notes.c.job_id, notes.c.text))]


def test_a_handler_that_declares_a_context_gets_the_job_facts(backend, caplog):
    queue = backend.queue()
    seen: list[sqlqueue.JobContext] = []
    facts: list[dict[str, object]] = []

    @queue.task("report", queue="reports", max_attempts=3, backoff=[0])
    def report(month: str, ctx: sqlqueue.JobContext) -> None:
        seen.append(ctx)
        facts.append(
            {
                "job_id": ctx.job_id,
                "job_type": ctx.job_type,
                "queue": ctx.queue,
                "attempt": ctx.attempt,
                "max_attempts": ctx.max_attempts,
                "enqueued_at": ctx.enqueued_at,
                "errors": [(e.attempt, e.error) for e in ctx.errors],
                "cancelled": ctx.cancelled,
                "engine": ctx.engine,
            }
        )
        ctx.logger.info("building %s", month)
        if ctx.attempt == 1:
            raise ValueError("warehouse not ready")

    with backend.engine.begin() as conn:
        job_id = report.enqueue(conn, month="2026-11")
    caplog.set_level(logging.INFO, logger="sqlqueue.job")
    drain(queue)
    drain(queue)
    job = queue.get_job(job_id)
    assert job.status == "succeeded"
    first, second = facts
    assert first == {
        "job_id": job_id,
        "job_type": "report",
        "queue": "reports",
        "attempt": 1,
        "max_attempts": 3,
        "enqueued_at": job.created_at,
        "errors": [],
        "cancelled": False,
        "engine": queue.engine,
    }
    assert second["attempt"] == 2
    assert second["errors"] == [(1, "ValueError: warehouse not ready")]
    assert f"[job {job_id} report #2] building 2026-11" in caplog.text


def test_writes_and_completion_land_together(backend):
    queue = backend.queue()
    notes.create(backend.engine)

    @queue.task("note")
    def note(text: str, ctx: sqlqueue.JobContext) -> dict[str, int]:
        with ctx.transaction() as conn:
            conn.execute(notes.insert().values(job_id=ctx.job_id, text=text))
            # Not visible to anyone else until the job's completion commits with it.
            assert _notes(backend.engine) == []
        return {"rows": 1}

    with backend.engine.begin() as conn:
        job_id = note.enqueue(conn, text="hello")
    drain(queue)
    job = queue.get_job(job_id)
    assert (job.status, job.result) == ("succeeded", {"rows": 1})
    assert _notes(backend.engine) == [(job_id, "hello")]


def test_an_orm_session_shares_the_jobs_transaction(backend):
    queue = backend.queue()
    notes.create(backend.engine)

    @queue.task("note")
    def note(ctx: sqlqueue.JobContext) -> None:
        with ctx.session() as session:
            assert isinstance(session, Session)
            session.execute(notes.insert().values(job_id=ctx.job_id, text="orm"))
            session.commit()  # a savepoint: the job's transaction decides
        raise sqlqueue.PermanentError("changed my mind")

    with backend.engine.begin() as conn:
        job_id = note.enqueue(conn)
    drain(queue)
    assert queue.get_job(job_id).status == "dead"
    assert _notes(backend.engine) == []


def test_a_handler_that_raises_after_writing_rolls_its_writes_back_and_retries(backend):
    queue = backend.queue()
    notes.create(backend.engine)

    @queue.task("note", backoff=[0])
    def note(ctx: sqlqueue.JobContext) -> None:
        with ctx.transaction() as conn:
            conn.execute(notes.insert().values(job_id=ctx.job_id, text=f"try {ctx.attempt}"))
        if ctx.attempt == 1:
            raise ConnectionError("upstream hiccup after the write")

    with backend.engine.begin() as conn:
        job_id = note.enqueue(conn)
    drain(queue)
    drain(queue)
    job = queue.get_job(job_id)
    assert (job.status, job.attempts) == ("succeeded", 2)
    assert _notes(backend.engine) == [(job_id, "try 2")]


def test_a_lost_lease_rolls_the_handlers_writes_back(backend, caplog):
    queue = backend.queue()
    notes.create(backend.engine)

    @queue.task("note")
    def note(ctx: sqlqueue.JobContext) -> None:
        # The reaper and another worker take the job while this one still runs it.
        with backend.engine.begin() as conn:
            conn.exec_driver_sql(
                "UPDATE sqlqueue_jobs SET locked_by = 'another-worker', attempts = attempts + 1"
            )
        with ctx.transaction() as conn:
            conn.execute(notes.insert().values(job_id=ctx.job_id, text="stale"))

    with backend.engine.begin() as conn:
        job_id = note.enqueue(conn)
    drain(queue)
    job = queue.get_job(job_id)
    assert (job.status, job.locked_by) == ("running", "another-worker")
    assert _notes(backend.engine) == []
    assert "its transaction rolled back (none of its writes landed)" in caplog.text


def test_async_handlers_complete_in_an_async_transaction(backend):
    queue = backend.queue()
    notes.create(backend.engine)

    @queue.task("anote", backoff=[0])
    async def anote(text: str, ctx: sqlqueue.JobContext) -> int:
        async with ctx.transaction_async() as conn:
            await conn.execute(notes.insert().values(job_id=ctx.job_id, text=text))
        await asyncio.sleep(0)
        if ctx.attempt == 1:
            raise ValueError("after the write")
        return ctx.attempt

    with backend.engine.begin() as conn:
        job_id = anote.enqueue(conn, text="async")
    drain(queue)
    drain(queue)
    job = queue.get_job(job_id)
    assert (job.status, job.result) == ("succeeded", 2)
    assert _notes(backend.engine) == [(job_id, "async")]
    asyncio.run(queue.async_engine().dispose())


def test_a_drain_closes_the_async_connections_it_opened_before_its_loop_ends(backend):
    # An asyncio driver's connection belongs to the loop that opened it. Left in the queue's
    # pool after drain()'s loop closed, it could serve no later loop, and closing it when it
    # is collected fails ("Event loop is closed", in whichever test runs then).
    queue = backend.queue()
    notes.create(backend.engine)

    @queue.task("anote")
    async def anote(text: str, ctx: sqlqueue.JobContext) -> None:
        async with ctx.transaction_async() as conn:
            await conn.execute(notes.insert().values(job_id=ctx.job_id, text=text))

    with backend.engine.begin() as conn:
        first = anote.enqueue(conn, text="first loop")
    assert drain_in_this_process(queue).succeeded == 1
    assert queue.async_engine().sync_engine.pool.checkedin() == 0

    with backend.engine.begin() as conn:
        second = anote.enqueue(conn, text="second loop")
    assert drain_in_this_process(queue).succeeded == 1  # its own connection, on its own loop
    assert queue.async_engine().sync_engine.pool.checkedin() == 0
    assert _notes(backend.engine) == [(first, "first loop"), (second, "second loop")]


def test_sigkill_between_the_writes_and_the_commit_loses_the_writes_and_reruns(backend):
    from tests.apps.context_app import ledger, metadata

    metadata.create_all(backend.engine)
    env = {**os.environ, "SQLQUEUE_DATABASE_URL": backend.url, "CONTEXT_LEASE_SECONDS": "1.5"}
    producer: Any = sqlqueue.Queue(backend.engine)
    producer.task("write_then_die")(lambda **payload: None)  # the workers have the handler
    with backend.engine.begin() as conn:
        job_id = producer.enqueue(conn, "write_then_die", {})
    command = [
        sys.executable,
        "-m",
        "sqlqueue",
        "worker",
        "tests.apps.context_app:queue",
        "--poll-interval",
        "0.05",
        "--burst",
    ]
    first = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=60)
    assert first.returncode == -9, first.stderr.decode()  # it killed itself mid-transaction
    with backend.engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(ledger)).scalar_one() == 0
    assert producer.get_job(job_id).status == "running"
    # Its worker is dead: its lease runs out (aged, not waited for), and a second worker
    # reaps it and runs the job again.
    age_jobs(producer, [job_id], by=timedelta(hours=1))

    def rerun() -> bool:
        subprocess.run(command, cwd=ROOT, env=env, capture_output=True, timeout=60)
        return bool(producer.get_job(job_id).status == "succeeded")

    wait_until(rerun, timeout=60, interval=0.1, what="a second worker to rerun the job")
    job = producer.get_job(job_id)
    assert (job.status, job.attempts, job.result) == ("succeeded", 2, "written on attempt 2")
    with backend.engine.connect() as conn:
        rows = conn.execute(sa.select(ledger.c.job_id, ledger.c.attempt)).all()
    assert [tuple(row) for row in rows] == [(job_id, 2)]


def test_the_return_value_is_stored_as_the_result(backend):
    queue = backend.queue(max_result_bytes=200)

    @queue.task("compute", max_attempts=1)
    def compute(kind: str) -> object:
        return {
            "ok": {"total": 42, "ids": [1, 2, 3]},
            "none": None,
            "huge": "x" * 500,
            "bad": {"when": {1, 2}},
        }[kind]

    with backend.engine.begin() as conn:
        ids = {kind: compute.enqueue(conn, kind=kind) for kind in ("ok", "none", "huge", "bad")}
    drain(queue)
    ok = queue.get_job(ids["ok"])
    assert (ok.status, ok.result) == ("succeeded", {"total": 42, "ids": [1, 2, 3]})
    assert queue.get_job(ids["none"]).result is None
    huge = queue.get_job(ids["huge"])
    assert huge.status == "dead"
    assert "the result is 502 bytes, over the 200-byte cap" in huge.last_error
    assert huge.errors[-1].kind == "ResultError"
    bad = queue.get_job(ids["bad"])
    assert bad.status == "dead"
    assert "result['when'] is a set" in bad.last_error


def test_set_result_stores_a_result_unless_the_handler_returns_another(backend):
    """``ctx.set_result``: checked at once; stored when the attempt succeeds, in its own
    transaction too; a non-None return value replaces it; async handlers have it; the steps
    after a workflow step read it in ``ctx.upstream_results``."""
    queue = backend.queue(max_result_bytes=200)
    refused: list[str] = []
    upstream: list[dict[str, Any]] = []

    @queue.task("early", max_attempts=1)
    def early(returned: Any, ctx: sqlqueue.JobContext) -> Any:
        ctx.set_result({"early": True})
        for bad in ({"when": {1, 2}}, "x" * 500):
            try:
                ctx.set_result(bad)
            except sqlqueue.PayloadError as error:
                refused.append(str(error))
        return returned

    @queue.task("in_transaction", max_attempts=1)
    def in_transaction(ctx: sqlqueue.JobContext) -> None:
        with ctx.transaction() as conn:
            conn.execute(notes.insert().values(job_id=ctx.job_id, text="written"))
        ctx.set_result("with the writes")

    @queue.task("early_async", max_attempts=1)
    async def early_async(ctx: sqlqueue.JobContext) -> None:
        ctx.set_result(["async"])

    @queue.task("after", max_attempts=1)
    def after(ctx: sqlqueue.JobContext) -> None:
        upstream.append(dict(ctx.upstream_results))

    notes.create(backend.engine)
    with backend.engine.begin() as conn:
        kept = early.enqueue(conn, returned=None)
        replaced = early.enqueue(conn, returned=7)
        written = in_transaction.enqueue(conn)
        awaited = early_async.enqueue(conn)
    wf = sqlqueue.Workflow()
    wf.add("first", sqlqueue.JobRequest(job_type="early_async"))
    wf.add("then", sqlqueue.JobRequest(job_type="after"), after=["first"])
    queue.enqueue_workflow(backend.engine, wf)
    drain(queue)
    assert queue.get_job(kept).result == {"early": True}
    assert queue.get_job(replaced).result == 7
    assert queue.get_job(written).result == "with the writes"
    assert queue.get_job(awaited).result == ["async"]
    assert _notes(backend.engine) == [(written, "written")]
    assert upstream == [{"first": ["async"]}]
    assert len(refused) == 4
    assert "ctx.set_result: result['when'] is a set" in refused[0]
    assert "the result is 502 bytes, over the 200-byte cap" in refused[1]


def test_a_set_result_value_changed_after_it_was_set_is_refused_naming_set_result(backend):
    """A value given to ``ctx.set_result`` is checked again when the attempt ends (the handler
    may change it after setting it): then the job is dead with an error naming
    ``ctx.set_result``, not the return value the handler never gave."""
    queue = backend.queue()

    @queue.task("changes_it", max_attempts=1)
    def changes_it(ctx: sqlqueue.JobContext) -> None:
        value: dict[str, Any] = {"ok": True}
        ctx.set_result(value)
        value["when"] = {1, 2}

    with backend.engine.begin() as conn:
        job_id = changes_it.enqueue(conn)
    drain(queue)
    job = queue.get_job(job_id)
    assert job.status == "dead"
    assert "ctx.set_result's value cannot be stored" in job.last_error
    assert "result['when'] is a set" in job.last_error


def test_progress_is_visible_while_running_and_extends_the_lease(backend):
    queue = backend.queue(lease_seconds=60)
    reported = threading.Event()
    release = threading.Event()

    @queue.task("crunch")
    def crunch(ctx: sqlqueue.JobContext) -> None:
        ctx.progress(3, 10, note="chunk 3 of 10")
        reported.set()
        assert release.wait(20)

    with backend.engine.begin() as conn:
        job_id = crunch.enqueue(conn)
    with WorkerThread(queue.worker(poll_interval=0.05)):
        assert reported.wait(20)
        wait_until(lambda: queue.get_job(job_id).progress is not None)
        job = queue.get_job(job_id)
        assert (job.progress.done, job.progress.total, job.progress.note) == (
            3,
            10,
            "chunk 3 of 10",
        )
        assert job.started_at <= job.progress.at
        assert job.lease_expires_at > job.started_at + timedelta(seconds=59)
        release.set()
        wait_until(lambda: queue.get_job(job_id).status == "succeeded")


def test_progress_doubles_as_a_heartbeat(backend):
    # A progress report renews the lease, as a heartbeat does. The lease is an hour, so the
    # worker's own heartbeat (every 20 min ± 10 %, after the one at its start) cannot beat
    # while the test watches.
    lease = 3600.0
    queue = backend.queue(lease_seconds=lease)
    claimed, report, finish = threading.Event(), threading.Event(), threading.Event()

    @queue.task("steady")
    def steady(ctx: sqlqueue.JobContext) -> None:
        claimed.set()
        report.wait(20)
        ctx.progress(1, 2)
        finish.wait(20)

    with backend.engine.begin() as conn:
        job_id = steady.enqueue(conn)

    def job() -> sqlqueue.Job:
        found: sqlqueue.Job | None = queue.get_job(job_id)
        assert found is not None
        return found

    def renewed_by_progress() -> datetime | None:
        now = job()
        return now.lease_expires_at if now.progress is not None else None

    with WorkerThread(queue.worker(poll_interval=0.05)):
        assert claimed.wait(20)
        first = job().lease_expires_at
        assert first is not None
        # The database clock moves on by a second, so a renewed lease is visibly later.
        wait_until(
            lambda: db_now(backend.engine) >= first - timedelta(seconds=lease - 1),
            what="a second of the database clock",
        )
        report.set()
        renewed = wait_until(renewed_by_progress, timeout=20, what="the progress report")
        finish.set()
    assert renewed - first >= timedelta(seconds=1)
    finished = job()
    assert (finished.status, finished.attempts, finished.errors) == ("succeeded", 1, ())


def test_shutdown_sets_the_cancelled_flag(backend):
    queue = backend.queue()
    started = threading.Event()

    @queue.task("long")
    def long_job(ctx: sqlqueue.JobContext) -> str:
        started.set()
        while not ctx.cancelled:
            time.sleep(0.02)
        return "stopped early"

    with backend.engine.begin() as conn:
        job_id = long_job.enqueue(conn)
    with WorkerThread(queue.worker(poll_interval=0.05)) as running:
        assert started.wait(20)
        running.stop()
    job = queue.get_job(job_id)
    assert (job.status, job.result) == ("succeeded", "stopped early")


def test_a_payload_field_cannot_pose_as_the_context(backend):
    queue = backend.queue()

    @queue.task("t")
    def t(ctx: sqlqueue.JobContext) -> None:
        pass

    with backend.engine.begin() as conn:
        with pytest.raises(sqlqueue.PayloadError, match="'ctx' is the handler's JobContext"):
            queue.enqueue(conn, "t", {"ctx": 1})
        # Written past the check (as another service's enqueue would): the worker refuses it.
        job_id = queue.enqueue(conn, "t", {"ctx": 1}, external=True)
    drain(queue)
    job = queue.get_job(job_id)
    assert job.status == "dead"
    assert "'ctx' is the handler's JobContext, not a payload field" in job.last_error


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ((-1, None), "progress done must be a finite number >= 0, got -1"),
        ((1, -5), "progress total must be a finite number >= 0, got -5"),
        ((float("nan"), None), "progress done must be a finite number >= 0, got nan"),
        ((1, float("inf")), "progress total must be a finite number >= 0, got inf"),
        ((10**400, None), "progress done must be a finite number >= 0, got 1000"),
        ((True, None), "progress done must be a number, got bool True"),
        ((1, None, "a\x00b"), "progress note contains a NUL character"),
        ((1, None, "x" * 1001), "progress note is 1001 characters long, over 1000"),
        ((1, None, "\ud800"), "progress note is not valid Unicode"),
    ],
)
def test_progress_refuses_what_a_database_cannot_store_in_the_handler(backend, bad, says):
    """Refused in the handler, where the mistake is: written later on the worker's database
    thread, a NaN or a NUL lost the progress of every job in the same write."""
    queue = backend.queue()
    errors: list[str] = []

    @queue.task("t")
    def t(ctx: sqlqueue.JobContext) -> None:
        try:
            ctx.progress(*bad)
        except sqlqueue.ConfigurationError as error:
            errors.append(str(error))
        ctx.progress(2, 3, "fine")

    with backend.engine.begin() as conn:
        job_id = t.enqueue(conn)
    drain(queue)
    assert len(errors) == 1
    assert errors[0].startswith(says)
    job = queue.get_job(job_id)
    assert job.status == "succeeded"
