"""Logs a machine can read: a worker process started with ``--log-format json`` prints one JSON
object per line, and every record about a job — sqlqueue's own, ``ctx.logger``'s and the app's
own logger's, sync and async — carries ``job_id``, ``job_type``, ``queue``, ``attempt`` and
``worker_id``. Importing sqlqueue adds no handler anywhere."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import sqlqueue
from sqlqueue import JobLogFilter, JsonLogFormatter
from tests._support import drain
from tests.apps.observe_app import queue as observe_queue
from tests.apps.processes import REPO_ROOT, Workers, wait_until
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(120)

JOB_FIELDS = ("job_id", "job_type", "queue", "attempt", "worker_id")


@pytest.fixture
def workers(backend: Backend, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(backend.url, tmp_path)
    try:
        yield started
    finally:
        started.close()


def records(text: str) -> list[dict[str, Any]]:
    """Every line of a worker's output as JSON (a line that is not fails the test)."""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def one(found: list[dict[str, Any]], message: str) -> dict[str, Any]:
    """The one record whose message contains ``message``."""
    matches = [record for record in found if message in record["message"]]
    assert len(matches) == 1, (message, matches)
    return matches[0]


def test_a_json_worker_prints_job_fields_on_every_job_record(
    backend: Backend, workers: Workers
) -> None:
    queue = observe_queue.rebind(backend.engine)
    with backend.engine.begin() as conn:
        chatty = queue.enqueue(conn, "chatty")
        chatty_async = queue.enqueue(conn, "chatty_async")
        doomed = queue.enqueue(conn, "doomed")
    worker = workers.start(
        "--queues", "default", "--poll-interval", "0.05", "--log-format", "json",
        app="tests.apps.observe_app:queue",
    )  # fmt: skip

    def finished() -> bool:
        jobs = [queue.get_job(job_id) for job_id in (chatty, chatty_async, doomed)]
        return all(job is not None and job.finished_at is not None for job in jobs)

    wait_until(finished, timeout=60, what="the jobs to finish", explain=worker.describe)
    assert worker.stop() == 0
    found = records(worker.log())

    for record in found:
        assert {"timestamp", "level", "logger", "message"} <= set(record), record
        assert record["worker_id"], record  # inside a job or not
    worker_id = one(found, "serving queues")["worker_id"]
    assert one(found, "stopped")["worker_id"] == worker_id

    def job_fields(record: dict[str, Any]) -> dict[str, Any]:
        return {name: record.get(name) for name in JOB_FIELDS}

    def expected(job_id: int, job_type: str, attempt: int) -> dict[str, Any]:
        return {
            "job_id": job_id,
            "job_type": job_type,
            "queue": "default",
            "attempt": attempt,
            "worker_id": worker_id,
        }

    handler = one(found, "hello from the handler")
    assert handler["logger"] == "sqlqueue.job"
    assert handler["level"] == "INFO"
    assert job_fields(handler) == expected(chatty, "chatty", 1)
    app_record = one(found, "hello from the app's own logger")
    assert app_record["logger"] == "tests.observe_app"
    assert job_fields(app_record) == expected(chatty, "chatty", 1)
    caught = one(found, "the handler logs an exception")
    assert caught["level"] == "ERROR"
    assert "ValueError: something the handler caught" in caught["exception"]
    assert "Traceback" in caught["exception"]
    assert job_fields(caught) == expected(chatty, "chatty", 1)
    assert job_fields(one(found, "hello from an async handler")) == expected(
        chatty_async, "chatty_async", 1
    )

    # The job that fails: its own records on both attempts, the retry, and its death.
    warnings = [r for r in found if r["message"] == "doomed is about to fail"]
    assert [job_fields(r) for r in warnings] == [
        expected(doomed, "doomed", 1),
        expected(doomed, "doomed", 2),
    ]
    retry = one(found, f"job {doomed} (doomed) attempt 1/2 failed")
    assert retry["level"] == "WARNING"
    assert job_fields(retry) == expected(doomed, "doomed", 1)
    dead = one(found, f"job {doomed} (doomed) is dead")
    assert dead["level"] == "ERROR"
    assert "this job always fails" in dead["message"]
    assert job_fields(dead) == expected(doomed, "doomed", 2)


def test_text_is_the_default_log_format(backend: Backend, workers: Workers) -> None:
    worker = workers.start("--burst", app="tests.apps.observe_app:queue")
    assert worker.wait(60) == 0
    lines = [line for line in worker.log().splitlines() if "serving queues" in line]
    assert len(lines) == 1
    assert " INFO sqlqueue.worker: worker " in lines[0]
    with pytest.raises(json.JSONDecodeError):
        json.loads(lines[0])


def test_importing_sqlqueue_adds_no_handler() -> None:
    script = """
import logging
import sqlqueue, sqlqueue.email, sqlqueue.webhooks
from sqlqueue._worker import loop, prometheus

loggers = [logging.getLogger()] + [
    logger for name, logger in logging.Logger.manager.loggerDict.items()
    if name.startswith("sqlqueue") and isinstance(logger, logging.Logger)
]
assert len(loggers) > 5, loggers
assert all(not logger.handlers for logger in loggers), [(l, l.handlers) for l in loggers]
assert logging.getLogRecordFactory() is logging.LogRecord
"""
    subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, check=True, timeout=60)


def test_the_json_formatter_writes_extra_fields_and_strings_for_the_rest() -> None:
    record = logging.LogRecord("app", logging.INFO, __file__, 1, "sent %d", (3,), None)
    record.job_id = 7
    record.when = object()
    JobLogFilter(worker_id="w1").filter(record)
    document = json.loads(JsonLogFormatter().format(record))
    assert document["message"] == "sent 3"
    assert document["level"] == "INFO"
    assert document["logger"] == "app"
    assert document["job_id"] == 7
    assert document["worker_id"] == "w1"
    assert document["when"].startswith("<object object")
    assert document["timestamp"].endswith("+00:00")


def test_a_gates_records_about_a_job_carry_its_fields(backend: Backend) -> None:
    """Records sqlqueue logs about a job before its handler runs (a rate limit deferring it)
    carry the job's fields too, not the worker's alone."""
    queue = backend.queue()

    @queue.task("tick", rate_limit=sqlqueue.RateLimit(per_second=10, burst=1))
    def tick() -> None:
        pass

    with backend.engine.begin() as conn:
        ids = [queue.enqueue(conn, "tick") for _ in range(3)]
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Keep(logging.DEBUG)
    handler.addFilter(JobLogFilter())
    logger = logging.getLogger("sqlqueue")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    try:
        drain(queue, concurrency=3)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    deferred = [record for record in seen if "deferred" in record.getMessage()]
    assert deferred, [record.getMessage() for record in seen]
    for record in deferred:
        fields = {name: getattr(record, name, None) for name in JOB_FIELDS}
        assert fields["job_id"] in ids, fields
        assert fields["job_type"] == "tick"
        assert fields["queue"] == "default"
        assert fields["attempt"] == 1
        assert fields["worker_id"], fields
