"""OpenTelemetry: a request's trace follows its jobs. Each test gives its queue a TracerProvider
of the SDK with an in-memory exporter (the global provider is set at most once per process, so
the one test of the default runs in a subprocess), enqueues, runs a worker, and reads the
finished spans: the producer span of the enqueue, the consumer span of each attempt, their
parents, kinds and attributes. Without OpenTelemetry (a subprocess that cannot import it) jobs
still run and store no trace context."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NoOpTracerProvider, SpanKind, StatusCode

import sqlqueue
from sqlqueue import testing
from sqlqueue._schema import jobs
from tests._support import WorkerThread, drain
from tests.apps.processes import REPO_ROOT, wait_until
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(120)


class Spans:
    """A TracerProvider of its own whose finished spans stay in memory."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("the app")

    def finished(self) -> Sequence[ReadableSpan]:
        return self.exporter.get_finished_spans()

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.finished() if span.name == name]

    def one(self, name: str) -> ReadableSpan:
        (span,) = self.named(name)
        return span


@pytest.fixture
def spans() -> Spans:
    return Spans()


def parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.trace_id)


def stored_context(backend: Backend, job_id: int) -> str | None:
    with backend.engine.connect() as conn:
        value = conn.execute(
            sa.select(jobs.c.trace_context).where(jobs.c.id == job_id)
        ).scalar_one()
    assert value is None or isinstance(value, str)
    return value


def test_a_request_its_enqueue_and_the_attempt_are_one_trace(
    backend: Backend, spans: Spans
) -> None:
    queue = backend.queue(tracer_provider=spans.provider)
    ran: list[int] = []

    @queue.task("send_welcome", queue="mail")
    def send_welcome(user_id: int) -> None:
        ran.append(user_id)

    with spans.tracer.start_as_current_span("POST /signup"), backend.engine.begin() as conn:
        job_id = send_welcome.enqueue(conn, user_id=7)
    carrier = json.loads(stored_context(backend, job_id) or "{}")
    drain(queue)

    assert ran == [7]
    request, send, process = (
        spans.one("POST /signup"),
        spans.one("send mail"),
        spans.one("process mail"),
    )
    assert trace_id(send) == trace_id(process) == trace_id(request)
    assert parent_id(send) == span_id(request)
    assert parent_id(process) == span_id(send)
    assert [link.context.span_id for link in process.links] == [span_id(send)]
    version, trace_hex, span_hex, flags = carrier["traceparent"].split("-")
    assert (version, trace_hex, span_hex) == (
        "00",
        f"{trace_id(send):032x}",
        f"{span_id(send):016x}",
    )
    assert int(flags, 16) & 1  # sampled
    assert send.kind is SpanKind.PRODUCER
    assert process.kind is SpanKind.CONSUMER
    assert dict(send.attributes or {}) == {
        "messaging.system": "sqlqueue",
        "messaging.operation.type": "send",
        "messaging.operation.name": "send",
        "messaging.destination.name": "mail",
        "messaging.message.id": str(job_id),
        "sqlqueue.job_type": "send_welcome",
    }
    assert dict(process.attributes or {}) == {
        "messaging.system": "sqlqueue",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "mail",
        "messaging.message.id": str(job_id),
        "sqlqueue.job_type": "send_welcome",
        "sqlqueue.attempt": 1,
        "sqlqueue.outcome": "succeeded",
    }
    assert process.status.status_code is StatusCode.UNSET
    assert send.end_time is not None
    assert process.start_time is not None
    assert send.end_time <= process.start_time


@pytest.mark.parametrize("kind", ["sync", "sync_timeout", "async", "async_timeout"])
def test_every_route_runs_the_handler_inside_the_attempt_span(
    backend: Backend, spans: Spans, kind: str
) -> None:
    queue = backend.queue(tracer_provider=spans.provider)
    inside: list[int] = []
    timeout = 60.0 if kind.endswith("timeout") else None

    def note() -> None:
        with spans.tracer.start_as_current_span("handler work") as span:
            inside.append(span.get_span_context().span_id)

    if kind.startswith("async"):

        @queue.task("work", timeout=timeout)
        async def work_async() -> None:
            await asyncio.sleep(0)
            note()

    else:

        @queue.task("work", timeout=timeout)
        def work() -> None:
            note()

    with backend.engine.begin() as conn:
        queue.enqueue(conn, "work")
    drain(queue)

    handler, process = spans.one("handler work"), spans.one("process default")
    assert parent_id(handler) == span_id(process)
    assert trace_id(handler) == trace_id(process) == trace_id(spans.one("send default"))


def test_a_failing_handler_errors_its_spans_then_retries_until_dead(
    backend: Backend, spans: Spans
) -> None:
    queue = backend.queue(tracer_provider=spans.provider)

    @queue.task("flaky", max_attempts=2, backoff=[0])
    def flaky() -> None:
        raise ValueError("the SMTP server said no")

    with spans.tracer.start_as_current_span("request"), backend.engine.begin() as conn:
        job_id = queue.enqueue(conn, "flaky")
    testing.drain(queue, retry_now=True)

    assert queue.get_job(job_id).status is sqlqueue.JobStatus.DEAD  # type: ignore[union-attr]
    send = spans.one("send default")
    first, second = sorted(spans.named("process default"), key=lambda s: s.start_time or 0)
    for attempt, span, outcome in ((1, first, "failed"), (2, second, "dead")):
        assert parent_id(span) == span_id(send)
        assert trace_id(span) == trace_id(spans.one("request"))
        attributes = span.attributes or {}
        assert attributes["sqlqueue.attempt"] == attempt
        assert attributes["sqlqueue.outcome"] == outcome
        assert attributes["error.type"] == "ValueError"
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "ValueError: the SMTP server said no"
        (event,) = span.events
        assert event.name == "exception"
        event_attributes = event.attributes or {}
        assert event_attributes["exception.type"] == "ValueError"
        assert event_attributes["exception.message"] == "ValueError: the SMTP server said no"
        assert "raise ValueError" in str(event_attributes["exception.stacktrace"])
    assert "sqlqueue.retry_in_seconds" in (first.attributes or {})
    assert "sqlqueue.retry_in_seconds" not in (second.attributes or {})


def test_a_snoozed_attempt_is_not_an_error(backend: Backend, spans: Spans) -> None:
    queue = backend.queue(tracer_provider=spans.provider)

    @queue.task("later")
    def later() -> None:
        raise sqlqueue.Snooze(3600)

    with backend.engine.begin() as conn:
        queue.enqueue(conn, "later")
    drain(queue)

    process = spans.one("process default")
    assert (process.attributes or {})["sqlqueue.outcome"] == "snoozed"
    assert process.status.status_code is StatusCode.UNSET
    assert not process.events


@pytest.mark.parametrize("route", ["sync", "async"])
def test_a_timed_out_attempt_ends_its_span_with_the_timeout(
    backend: Backend, spans: Spans, route: str
) -> None:
    queue = backend.queue(tracer_provider=spans.provider)

    if route == "sync":

        @queue.task("slow", timeout=0.2, max_attempts=1)
        def slow() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # Python code: the timeout interrupts it
                time.sleep(0.01)

    else:

        @queue.task("slow", timeout=0.2, max_attempts=1)
        async def slow_async() -> None:
            await asyncio.sleep(30)

    with backend.engine.begin() as conn:
        queue.enqueue(conn, "slow")
    drain(queue)

    process = spans.one("process default")
    attributes = process.attributes or {}
    assert (attributes["sqlqueue.outcome"], attributes["error.type"]) == ("dead", "JobTimeout")
    assert "ran past its timeout of 0.2 s" in str(process.status.description)


@pytest.mark.interrupts_handler_threads
def test_cancelled_and_released_attempts_say_so(backend: Backend, spans: Spans) -> None:
    queue = backend.queue(tracer_provider=spans.provider, lease_seconds=3)  # a beat a second
    release = threading.Event()

    @queue.task("waits_for_cancel", max_attempts=5)
    def waits_for_cancel(ctx: sqlqueue.JobContext) -> None:
        deadline = time.monotonic() + 30
        while not ctx.cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        raise RuntimeError("stopped: cancelled")

    @queue.task("long", max_attempts=5)
    def long() -> None:
        release.wait(60)  # past the worker's shutdown grace

    with backend.engine.begin() as conn:
        cancelled_id = queue.enqueue(conn, "waits_for_cancel")
        long_id = queue.enqueue(conn, "long")
    worker = queue.worker(poll_interval=0.05, shutdown_timeout=0.1)

    def running(job_id: int) -> bool:
        job = queue.get_job(job_id)
        return job is not None and job.status == "running"

    with WorkerThread(worker):
        wait_until(
            lambda: running(cancelled_id) and running(long_id), timeout=30, what="both running"
        )
        queue.cancel(cancelled_id)
        wait_until(
            lambda: (job := queue.get_job(cancelled_id)) is not None and job.status == "cancelled",
            timeout=30,
            what="the job to end cancelled",
        )
    release.set()
    # Stopped with "long" still running: it is released, and its span ends saying so.
    outcomes = {
        (span.attributes or {})["messaging.message.id"]: (span.attributes or {})["sqlqueue.outcome"]
        for span in spans.named("process default")
    }
    assert outcomes == {str(cancelled_id): "cancelled", str(long_id): "released"}


def test_a_worker_that_stops_without_writing_outcomes_ends_their_spans(
    backend: Backend, spans: Spans
) -> None:
    """An app that runs ``worker.serve()`` in its own event loop and cancels it (its loop
    shutting down) leaves no outcome written and nothing released: the worker still ends the
    spans of its attempts when it stops, or the queue would keep them open for its lifetime.
    Another worker of the same queue in the same process keeps its own spans open."""
    queue = backend.queue(tracer_provider=spans.provider, lease_seconds=3)
    release = threading.Event()
    started = threading.Event()
    other_release = threading.Event()
    woken = asyncio.Event()

    @queue.task("sync_long", max_attempts=5)
    def sync_long() -> None:
        started.set()
        release.wait(60)

    @queue.task("async_long", max_attempts=5)
    async def async_long() -> None:
        await woken.wait()  # never set: cancelled with the worker

    @queue.task("other_long", queue="other")
    def other_long() -> None:
        other_release.wait(60)

    with backend.engine.begin() as conn:
        sync_id = queue.enqueue(conn, "sync_long")
        async_id = queue.enqueue(conn, "async_long")
        other_id = queue.enqueue(conn, "other_long")
    worker = queue.worker(queues=["default"], poll_interval=0.05)
    other = queue.worker(queues=["other"], poll_interval=0.05)
    tracing = queue.tracing
    assert tracing is not None

    async def app() -> None:
        serving = asyncio.create_task(worker.serve())
        deadline = time.monotonic() + 60
        while tracing.open_spans < 3:  # all three handlers are in their spans
            assert time.monotonic() < deadline, "the three jobs did not start"
            assert not serving.done(), serving
            await asyncio.sleep(0.02)
        serving.cancel()
        with pytest.raises(asyncio.CancelledError):
            await serving

    with WorkerThread(other):
        try:
            asyncio.run(app())
            assert started.is_set()
        finally:
            release.set()
        assert tracing.open_spans == 1  # the other worker's attempt, still running
        other_release.set()
        wait_until(
            lambda: (job := queue.get_job(other_id)) is not None and job.status == "succeeded",
            timeout=30,
            what="the other worker's job to succeed",
        )
    assert tracing.open_spans == 0
    outcomes = {
        (span.attributes or {})["messaging.message.id"]: (span.attributes or {})["sqlqueue.outcome"]
        for span in spans.finished()
        if span.name.startswith("process ")
    }
    assert outcomes == {
        str(sync_id): "abandoned",
        str(async_id): "abandoned",
        str(other_id): "succeeded",
    }


def test_a_job_no_handler_can_run_still_gets_its_attempt_span(
    backend: Backend, spans: Spans
) -> None:
    queue = backend.queue(tracer_provider=spans.provider, unknown_jobs="dead")
    queue.task("handled")(lambda: None)
    with spans.tracer.start_as_current_span("request"), backend.engine.begin() as conn:
        queue.enqueue(conn, "nobody_handles_this", external=True)
    drain(queue)

    process = spans.one("process default")
    assert parent_id(process) == span_id(spans.one("send default"))
    assert (process.attributes or {})["sqlqueue.outcome"] == "dead"
    assert (process.attributes or {})["error.type"] == "UnknownJobType"
    assert process.status.status_code is StatusCode.ERROR


def test_a_bulk_enqueue_is_one_span_and_every_job_continues_it(
    backend: Backend, spans: Spans
) -> None:
    queue = backend.queue(tracer_provider=spans.provider)

    @queue.task("resize", queue="images")
    def resize(n: int) -> None:
        pass

    count = 250  # past the COPY threshold, where a backend can COPY
    with spans.tracer.start_as_current_span("upload"), backend.engine.begin() as conn:
        ids = resize.enqueue_many(conn, [{"n": n} for n in range(count)])
        keyed = queue.enqueue_many(
            conn,
            [
                sqlqueue.JobRequest(job_type="resize", payload={"n": n}, idempotency_key=f"k{n}")
                for n in range(count)
            ],
        )
    stored = {stored_context(backend, job_id) for job_id in [*ids, *keyed]}
    drain(queue, concurrency=8)

    sends = spans.named("send images")
    assert len(sends) == 2
    for send in sends:
        assert parent_id(send) == span_id(spans.one("upload"))
        assert (send.attributes or {})["messaging.batch.message_count"] == count
        assert "messaging.message.id" not in (send.attributes or {})
    assert len(stored) == 2
    assert None not in stored
    processes = spans.named("process images")
    assert len(processes) == 2 * count
    assert {parent_id(span) for span in processes} == {span_id(send) for send in sends}


def test_a_bulk_enqueue_into_several_queues_names_no_destination(
    backend: Backend, spans: Spans
) -> None:
    queue = backend.queue(tracer_provider=spans.provider)
    with backend.engine.begin() as conn:
        queue.enqueue_many(
            conn,
            [
                sqlqueue.JobRequest(job_type="a", queue="one", external=True),
                sqlqueue.JobRequest(job_type="b", queue="two", external=True),
            ],
        )
    send = spans.one("send")
    assert "messaging.destination.name" not in (send.attributes or {})
    assert "sqlqueue.job_type" not in (send.attributes or {})
    assert (send.attributes or {})["messaging.batch.message_count"] == 2


def test_a_failed_enqueue_errors_its_span_without_quoting_the_payload(
    backend: Backend, spans: Spans
) -> None:
    queue = backend.queue(tracer_provider=spans.provider)
    payload_text = f"private-{secrets.token_hex(8)}"
    with backend.engine.connect() as conn:
        conn.execute(jobs.delete())  # (begins the transaction)
        conn.execute(sa.text("DROP TABLE sqlqueue_jobs"))  # the INSERT fails in the database
        with pytest.raises(sqlqueue.SqlqueueError) as failed:
            queue.enqueue(conn, "x", {"note": payload_text}, external=True)
        conn.rollback()
    # What record_exception would have stored: the traceback, whose chained driver error
    # quotes the INSERT's parameters.
    assert payload_text in "".join(traceback.format_exception(failed.value))
    send = spans.one("send default")
    assert send.status.status_code is StatusCode.ERROR
    assert "error.type" in (send.attributes or {})
    assert payload_text not in json.dumps(
        [
            dict(send.attributes or {}),
            send.status.description,
            [dict(e.attributes or {}) for e in send.events],
        ]
    )


def test_async_enqueues_are_traced_like_the_others(backend: Backend, spans: Spans) -> None:
    pytest.importorskip("sqlalchemy.ext.asyncio")
    queue = backend.queue(tracer_provider=spans.provider)

    @queue.task("ping")
    def ping() -> None:
        pass

    async def enqueue() -> tuple[int, list[int]]:
        engine = queue.async_engine()
        try:
            with spans.tracer.start_as_current_span("async request"):
                async with engine.begin() as conn:
                    one = await queue.enqueue_async(conn, "ping")
                    many = await queue.enqueue_many_async(
                        conn, [sqlqueue.JobRequest(job_type="ping") for _ in range(3)]
                    )
            return one, many
        finally:
            await engine.dispose()

    one, many = asyncio.run(enqueue())
    request = spans.one("async request")
    single, batch = sorted(
        spans.named("send default"),
        key=lambda s: "messaging.batch.message_count" in (s.attributes or {}),
    )
    assert parent_id(single) == parent_id(batch) == span_id(request)
    assert (single.attributes or {})["messaging.message.id"] == str(one)
    assert (batch.attributes or {})["messaging.batch.message_count"] == 3
    for job_id in [one, *many]:
        assert stored_context(backend, job_id) is not None


@pytest.mark.parametrize("route", ["sync", "async"])
def test_a_job_enqueued_by_a_handler_continues_the_attempts_trace(
    backend: Backend, spans: Spans, route: str
) -> None:
    queue = backend.queue(tracer_provider=spans.provider)

    @queue.task("child", queue="children")
    def child() -> None:
        pass

    if route == "sync":

        @queue.task("parent")
        def parent(ctx: sqlqueue.JobContext) -> None:
            with ctx.transaction() as conn:
                child.enqueue(conn)

    else:

        @queue.task("parent")
        async def parent_async(ctx: sqlqueue.JobContext) -> None:
            async with ctx.transaction_async() as conn:
                await child.enqueue_async(conn)

    with spans.tracer.start_as_current_span("request"), backend.engine.begin() as conn:
        queue.enqueue(conn, "parent")

    async def drain_then_dispose() -> None:  # the async engine's connections, on their loop
        await testing.drain_async(queue)
        await queue.async_engine().dispose()

    if route == "sync":
        drain(queue)
    else:
        asyncio.run(drain_then_dispose())

    request = spans.one("request")
    parent_process = spans.one("process default")
    child_send, child_process = spans.one("send children"), spans.one("process children")
    assert parent_id(child_send) == span_id(parent_process)
    assert parent_id(child_process) == span_id(child_send)
    assert {trace_id(s) for s in (parent_process, child_send, child_process)} == {trace_id(request)}


def test_a_batch_its_fan_out_and_its_callback_stay_in_the_request_trace(
    backend: Backend, spans: Spans
) -> None:
    queue = backend.queue(tracer_provider=spans.provider)

    @queue.task("part", queue="parts")
    def part(n: int, ctx: sqlqueue.JobContext) -> None:
        if n == 0:  # one child fans out into two more of the same batch
            ctx.add_to_batch(
                [
                    sqlqueue.JobRequest(job_type="part", payload={"n": 10}),
                    sqlqueue.JobRequest(job_type="part", payload={"n": 11}),
                ]
            )

    @queue.task("assemble", queue="reports")
    def assemble(ctx: sqlqueue.JobContext) -> None:
        assert ctx.batch is not None
        assert ctx.batch.total == 4

    with spans.tracer.start_as_current_span("POST /reports"), backend.engine.begin() as conn:
        batch = queue.enqueue_batch(
            conn,
            [
                sqlqueue.JobRequest(job_type="part", payload={"n": 0}),
                sqlqueue.JobRequest(job_type="part", payload={"n": 1}),
            ],
            on_complete=sqlqueue.JobRequest(job_type="assemble"),
        )
    drain(queue)

    status = queue.get_batch(batch.id)
    assert status is not None
    assert status.succeeded == 4
    assert status.callback_job_id is not None
    request, send = spans.one("POST /reports"), spans.one("send parts")
    assert parent_id(send) == span_id(request)
    assert send.attributes is not None
    assert send.attributes["messaging.batch.message_count"] == 2
    processes = spans.named("process parts")
    assert len(processes) == 4
    (fanning,) = [
        s
        for s in processes
        if s.attributes and s.attributes["messaging.message.id"] == str(batch.job_ids[0])
    ]
    by_parent = sorted(parent_id(s) or 0 for s in processes)
    # The two first children continue the producer span; the two it added continue its attempt.
    assert by_parent == sorted([span_id(send)] * 2 + [span_id(fanning)] * 2)
    callback = spans.one("process reports")
    assert parent_id(callback) == span_id(send)
    assert {trace_id(s) for s in (*processes, callback)} == {trace_id(request)}


def test_an_empty_batchs_callback_is_sent_in_the_request_trace(
    backend: Backend, spans: Spans
) -> None:
    """An empty batch enqueues its ``on_complete`` at once: that enqueue is the producer span,
    and the callback's attempt continues the request's trace."""
    queue = backend.queue(tracer_provider=spans.provider)

    @queue.task("assemble", queue="reports")
    def assemble(ctx: sqlqueue.JobContext) -> None:
        assert ctx.batch is not None

    with spans.tracer.start_as_current_span("POST /reports"), backend.engine.begin() as conn:
        batch = queue.enqueue_batch(conn, [], on_complete=sqlqueue.JobRequest(job_type="assemble"))
    status = queue.get_batch(batch.id)
    assert status is not None
    assert status.callback_job_id is not None
    assert stored_context(backend, status.callback_job_id) is not None
    drain(queue)

    request, send = spans.one("POST /reports"), spans.one("send reports")
    assert parent_id(send) == span_id(request)
    assert send.kind is SpanKind.PRODUCER
    process = spans.one("process reports")
    assert parent_id(process) == span_id(send)
    assert trace_id(process) == trace_id(request)


def test_without_a_valid_span_at_enqueue_the_column_is_null_and_attempts_start_a_trace(
    backend: Backend, spans: Spans
) -> None:
    # The app's web process has OpenTelemetry but no SDK configured; its worker has one.
    web = backend.queue(tracer_provider=NoOpTracerProvider())
    worker_queue = backend.queue(tracer_provider=spans.provider)

    @worker_queue.task("report")
    def report() -> None:
        pass

    with backend.engine.begin() as conn:
        job_id = web.enqueue(conn, "report", external=True)
    assert stored_context(backend, job_id) is None
    drain(worker_queue)

    (process,) = spans.finished()
    assert process.name == "process default"
    assert process.parent is None
    assert not process.links


def test_without_an_sdk_an_incoming_context_still_reaches_the_row(
    backend: Backend, spans: Spans
) -> None:
    """OpenTelemetry installed but not configured: sqlqueue makes no span, yet a context that
    came from upstream (here the app's own span) is stored, so a traced worker continues it."""
    web = backend.queue(tracer_provider=NoOpTracerProvider())
    worker_queue = backend.queue(tracer_provider=spans.provider)

    @worker_queue.task("report")
    def report() -> None:
        pass

    with spans.tracer.start_as_current_span("upstream"), backend.engine.begin() as conn:
        job_id = web.enqueue(conn, "report", external=True)
    assert spans.named("send default") == []
    assert stored_context(backend, job_id) is not None
    drain(worker_queue)

    assert parent_id(spans.one("process default")) == span_id(spans.one("upstream"))


def test_an_unreadable_stored_context_starts_a_new_trace(backend: Backend, spans: Spans) -> None:
    queue = backend.queue(tracer_provider=spans.provider)
    ran: list[bool] = []

    @queue.task("odd")
    def odd() -> None:
        ran.append(True)

    with backend.engine.begin() as conn:
        job_id = queue.enqueue(conn, "odd")
        conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(trace_context="not json {"))
    drain(queue)

    assert ran == [True]
    process = spans.one("process default")
    assert process.parent is None


def test_secrets_never_reach_a_span(backend: Backend, spans: Spans) -> None:
    token = f"canary-{secrets.token_hex(12)}"
    queue = backend.queue(tracer_provider=spans.provider, encryption_keys=[Fernet.generate_key()])

    @queue.task("charge", secret_fields=["token"], max_attempts=2, backoff=[0])
    def charge(token: str, amount: int) -> None:
        raise ValueError(f"gateway refused token {token!r} for {amount}")

    with spans.tracer.start_as_current_span("checkout"), backend.engine.begin() as conn:
        queue.enqueue(conn, "charge", {"token": token, "amount": 5})
    testing.drain(queue, retry_now=True)

    processes = spans.named("process default")
    assert len(processes) == 2
    assert all(span.status.status_code is StatusCode.ERROR for span in processes)
    assert "***" in str(processes[0].status.description)
    for span in spans.finished():
        seen = json.dumps(
            {
                "name": span.name,
                "attributes": dict(span.attributes or {}),
                "status": span.status.description,
                "events": [[e.name, dict(e.attributes or {})] for e in span.events],
            }
        )
        assert token not in seen, span.name


def test_the_global_tracer_provider_is_the_default(backend: Backend, tmp_path: Path) -> None:
    """In a process of its own: the global provider may be set only once. A queue that was
    already used before it was set sees it within ``_RECHECK_SECONDS`` (0.1 s): the enqueue
    before it has no span, the one after it does, and both attempts have theirs."""
    script = textwrap.dedent(
        f"""
        import json, sys, time
        import sqlalchemy as sa
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        import sqlqueue

        queue = sqlqueue.Queue(sa.create_engine({backend.url!r}))  # before the provider is set

        @queue.task("hello")
        def hello(n):
            pass

        with queue.engine.begin() as conn:
            queue.enqueue(conn, "hello", {{"n": 1}})  # no provider yet: no span
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        time.sleep(0.15)

        with queue.engine.begin() as conn:
            queue.enqueue(conn, "hello", {{"n": 2}})
        queue.worker(poll_interval=0.02).run(burst=True)
        print(json.dumps(sorted(span.name for span in exporter.get_finished_spans())))
        """
    )
    answer = run_python(script, tmp_path)
    assert json.loads(answer.stdout.strip().splitlines()[-1]) == [
        "process default",
        "process default",
        "send default",
    ]


def test_without_opentelemetry_jobs_run_and_store_no_trace_context(
    backend: Backend, tmp_path: Path
) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["opentelemetry"] = None  # as if the package were not installed
        import sqlalchemy as sa
        import sqlqueue
        from sqlqueue._schema import jobs

        queue = sqlqueue.Queue(sa.create_engine({backend.url!r}))
        assert queue.tracing is None
        ran = []

        @queue.task("hello")
        def hello(n):
            ran.append(n)

        assert "trace" not in hello.plan.steps
        with queue.engine.begin() as conn:
            job_id = queue.enqueue(conn, "hello", {{"n": 1}})
            queue.enqueue_many(conn, [sqlqueue.JobRequest(job_type="hello", payload={{"n": 2}})])
        queue.worker(poll_interval=0.02).run(burst=True)
        with queue.engine.connect() as conn:
            stored = conn.execute(sa.select(jobs.c.trace_context)).scalars().all()
        assert sorted(ran) == [1, 2], ran
        assert stored == [None, None], stored
        assert not any(name.startswith("opentelemetry.") for name in sys.modules)
        try:
            sqlqueue.Queue(queue.engine, tracer_provider=object())
        except sqlqueue.ConfigurationError as error:
            print(error)
        """
    )
    answer = run_python(script, tmp_path)
    assert "pip install 'sqlalchemy-sqlqueue[otel]'" in answer.stdout


def test_a_tracer_provider_that_is_not_one_is_refused(backend: Backend) -> None:
    with pytest.raises(sqlqueue.ConfigurationError, match="tracer_provider: expected"):
        backend.queue(tracer_provider="jaeger")


def run_python(script: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "script.py"
    path.write_text(script)
    env: dict[str, Any] = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    answer = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, env=env, timeout=90
    )
    assert answer.returncode == 0, answer.stderr
    return answer


def test_tracing_is_on_by_default_when_opentelemetry_is_installed(backend: Backend) -> None:
    queue = backend.queue()
    assert queue.tracing is not None
    assert queue.tracing.tracer_provider is None  # the global one, whenever it is set


@pytest.mark.parametrize("is_async", [True, False], ids=["async", "sync"])
def test_without_an_sdk_the_span_step_is_passed_by(
    backend: Backend, monkeypatch: pytest.MonkeyPatch, is_async: bool
) -> None:
    """Not recording, the ``trace`` step calls the handler straight (an async attempt then
    makes no coroutines for it): nothing of the span machinery runs per attempt, and the job
    still succeeds."""
    queue = backend.queue(tracer_provider=NoOpTracerProvider())
    assert queue.tracing is not None
    started: list[int] = []
    monkeypatch.setattr(queue.tracing, "start_attempt", lambda job: started.append(job.id))
    ran: list[str] = []

    if is_async:

        @queue.task("hello")
        async def hello() -> None:
            ran.append("async")

    else:

        @queue.task("hello", timeout=30)  # a loop-side step: not the direct route
        def hello() -> None:
            ran.append("sync")

    assert "trace" in hello.plan.steps
    with backend.engine.begin() as conn:
        job_id = hello.enqueue(conn)
    drain(queue)
    assert ran == ["async" if is_async else "sync"]
    assert started == []
    job = queue.get_job(job_id)
    assert job is not None
    assert job.status == "succeeded"
