"""Bad input gets a clear, typed error and loses nothing."""

from __future__ import annotations

import asyncio
import json
import math
import re
import sqlite3
import threading
import time
from datetime import UTC, datetime
from decimal import Decimal
from types import SimpleNamespace

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import jobs
from sqlqueue.dialects.sqlite import check_sqlite_json, check_sqlite_version
from tests._support import count_jobs, drain, wait_until


def _deep(levels: int) -> dict[str, object]:
    value: dict[str, object] = {}
    for _ in range(levels):
        value = {"x": value}
    return value


POISON = [
    pytest.param({"tags": {"a", "b"}}, re.escape("payload['tags'] is a set"), id="set"),
    pytest.param({"blob": b"\x00\x01"}, re.escape("payload['blob'] is a bytes"), id="bytes"),
    pytest.param({"when": datetime(2026, 1, 1, tzinfo=UTC)}, "is a datetime", id="datetime"),
    pytest.param({"amount": Decimal("1.5")}, "is a Decimal", id="decimal"),
    pytest.param({"ratio": math.nan}, "JSON cannot represent", id="nan"),
    pytest.param({"ratio": math.inf}, "JSON cannot represent", id="inf"),
    pytest.param({"big": 1.8237199422851508e16}, re.escape("beyond 2**53"), id="huge-float"),
    pytest.param({"name": "\ud800"}, "not valid Unicode", id="lone-surrogate"),
    pytest.param({"name": "a\x00b"}, "NUL character", id="nul"),
    pytest.param({"ids": {1: "a"}}, "JSON keys are strings", id="int-key"),
    pytest.param(_deep(100), "nested more than", id="deep-nesting"),
    pytest.param(["not", "a", "mapping"], "must be a mapping", id="list-payload"),
    pytest.param({"blob": "x" * 70_000}, "over the 65536-byte cap", id="oversize"),
]


@pytest.mark.parametrize(("payload", "message"), POISON)
def test_poison_payload_is_refused_and_the_transaction_stays_usable(backend, payload, message):
    queue = backend.queue()

    @queue.task("t")
    def t(**kwargs: object) -> None:
        pass

    with backend.engine.connect() as conn, conn.begin():
        with pytest.raises(sqlqueue.PayloadError, match=message):
            queue.enqueue(conn, "t", payload)
        # Nothing was sent: the same transaction still works and commits.
        good = queue.enqueue(conn, "t", {"ok": True})
    assert count_jobs(backend.engine) == 1
    assert queue.get_job(good).payload == {"ok": True}


def test_payload_cap_is_configurable(backend):
    queue = backend.queue(max_payload_bytes=100)

    @queue.task("t")
    def t(text: str) -> None:
        pass

    with backend.engine.begin() as conn:
        t.enqueue(conn, text="x" * 50)
        with pytest.raises(sqlqueue.PayloadError, match="over the 100-byte cap"):
            t.enqueue(conn, text="x" * 200)
    assert count_jobs(backend.engine) == 1


def test_unknown_job_type_is_refused_unless_external(backend):
    queue = backend.queue()

    @queue.task("known")
    def known() -> None:
        pass

    with backend.engine.begin() as conn:
        with pytest.raises(sqlqueue.UnknownJobType, match=r"no task named 'billing.sync'.*known"):
            queue.enqueue(conn, "billing.sync", {"account": 1})
        external = queue.enqueue(
            conn, "billing.sync", {"account": 1}, external=True, queue="billing"
        )
    assert queue.get_job(external).job_type == "billing.sync"
    assert count_jobs(backend.engine) == 1


def test_bad_options_are_refused_before_any_sql(backend):
    queue = backend.queue()

    @queue.task("t")
    def t() -> None:
        pass

    with backend.engine.connect() as conn, conn.begin():
        with pytest.raises(sqlqueue.EnqueueError, match="delay must be >= 0"):
            t.options(delay=-1).enqueue(conn)
        with pytest.raises(sqlqueue.EnqueueError, match="timezone-aware"):
            t.options(run_at=datetime(2026, 1, 1)).enqueue(conn)
        with pytest.raises(sqlqueue.EnqueueError, match="either delay or run_at"):
            t.options(delay=1, run_at=datetime(2026, 1, 1, tzinfo=UTC)).enqueue(conn)
        with pytest.raises(
            sqlqueue.EnqueueError, match="max_attempts must be between 1 and 2147483647"
        ):
            t.options(max_attempts=0).enqueue(conn)
        with pytest.raises(sqlqueue.EnqueueError, match="idempotency_key"):
            t.options(idempotency_key="k" * 300).enqueue(conn)
        with pytest.raises(sqlqueue.ConfigurationError, match="unknown enqueue option"):
            t.options(dealy=5)
        t.enqueue(conn)
    assert count_jobs(backend.engine) == 1


def test_with_the_dead_policy_a_job_without_a_handler_goes_dead_and_the_worker_goes_on(backend):
    producer = backend.queue()

    @producer.task("gone")
    def gone() -> None:
        pass

    @producer.task("here")
    def here_producer() -> None:
        pass

    with backend.engine.begin() as conn:
        orphan = gone.enqueue(conn)
        fine = here_producer.enqueue(conn)

    consumer = backend.queue(unknown_jobs="dead")
    ran = []

    @consumer.task("here")
    def here() -> None:
        ran.append(True)

    drain(consumer)
    job = consumer.get_job(orphan)
    assert job.status == "dead"
    assert job.attempts == 1
    assert "no handler for job type 'gone' in this worker (it knows: here)" in job.last_error
    assert job.errors[-1].kind == "UnknownJobType"
    assert consumer.get_job(fine).status == "succeeded"
    assert ran == [True]


def test_by_default_unknown_jobs_are_left_for_another_worker(backend):
    producer = backend.queue()

    @producer.task("elsewhere")
    def elsewhere() -> None:
        pass

    with backend.engine.begin() as conn:
        job_id = elsewhere.enqueue(conn)
    consumer = backend.queue()

    @consumer.task("mine")
    def mine() -> None:
        pass

    drain(consumer)
    job = consumer.get_job(job_id)
    assert (job.status, job.attempts) == ("queued", 0)


def test_payload_that_no_longer_fits_the_handler_goes_dead_with_a_clear_error(backend):
    old = backend.queue()

    @old.task("resize")
    def resize_v1(image_id: int) -> None:
        pass

    with backend.engine.begin() as conn:
        job_id = resize_v1.enqueue(conn, image_id=7)

    new = backend.queue()

    @new.task("resize")
    def resize_v2(image_id: int, width: int) -> None:
        pass

    drain(new)
    job = new.get_job(job_id)
    assert job.status == "dead"
    assert job.attempts == 1
    assert "the payload does not fit resize(image_id, width)" in job.last_error
    assert "missing a required argument: 'width'" in job.last_error


def test_unreachable_database_gives_a_clear_error():
    queue = sqlqueue.Queue("postgresql+psycopg://postgres@127.0.0.1:1/nowhere")

    @queue.task("t")
    def t() -> None:
        pass

    with pytest.raises(sqlqueue.DatabaseUnavailable, match="cannot reach PostgreSQL"):
        t.enqueue(queue.engine)
    with pytest.raises(sqlqueue.DatabaseUnavailable, match="cannot reach PostgreSQL"):
        queue.get_job(1)


def test_missing_schema_says_to_migrate(backend, tmp_path):
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    queue = sqlqueue.Queue(engine)

    @queue.task("t")
    def t() -> None:
        pass

    with pytest.raises(sqlqueue.SchemaNotMigrated, match="run `sqlqueue migrate`"):
        t.enqueue(engine)


def test_worker_retries_connecting_until_the_database_appears(tmp_path, caplog):
    folder = tmp_path / "not-yet"
    url = f"sqlite:///{folder / 'jobs.db'}"
    queue = sqlqueue.Queue(url)
    ran = threading.Event()

    @queue.task("t")
    def t() -> None:
        ran.set()

    worker = queue.worker(poll_interval=0.05)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    wait_until(lambda: "cannot claim jobs" in caplog.text, timeout=10)
    assert thread.is_alive()
    # The database appears: the worker recovers on its own.
    folder.mkdir()
    sqlqueue.migrate(url)
    t.enqueue(queue.engine)
    assert ran.wait(15), "the worker did not recover once the database appeared"
    worker.stop()
    thread.join(15)
    assert not thread.is_alive()
    assert "cannot open the SQLite database" in caplog.text


def test_old_sqlite_is_refused_with_the_reason():
    with pytest.raises(
        sqlqueue.UnsupportedDatabase, match=r"SQLite 3\.31\.1 has no RETURNING.*>= 3\.35"
    ):
        check_sqlite_version((3, 31, 1))
    check_sqlite_version(sqlite3.sqlite_version_info)


def test_a_sqlite_without_json_functions_is_refused_with_the_reason():
    """Before 3.38 the JSON functions were a build option; completions need json_each. An
    authorizer that refuses it stands in for such a build."""

    def without_json(database: str) -> sqlite3.Connection:
        conn = sqlite3.connect(database)
        conn.set_authorizer(
            lambda action, arg1, arg2, *_: (
                sqlite3.SQLITE_DENY
                if action == sqlite3.SQLITE_READ and arg1 == "json_each"
                else sqlite3.SQLITE_OK
            )
        )
        return conn

    with pytest.raises(sqlqueue.UnsupportedDatabase, match=r"lacks the JSON functions.*JSON1"):
        check_sqlite_json(sqlite3, connect=without_json)
    check_sqlite_json()


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://",
        "sqlite:///:memory:",
        "sqlite+pysqlite:///:memory:",
        "sqlite:///file::memory:?uri=true",
        "sqlite:///file:jobs?mode=memory&cache=shared&uri=true",
    ],
)
def test_an_in_memory_sqlite_database_is_refused_where_the_queue_is_made(url):
    """Each connection to it has a private database: enqueue and migrate would seem to work,
    and a worker would find no tables. Refused for a URL and for an engine alike."""
    for target in (url, sa.create_engine(url)):
        with pytest.raises(sqlqueue.ConfigurationError) as refused:
            sqlqueue.Queue(target)
        message = str(refused.value)
        assert "\n" not in message
        assert "is an in-memory SQLite database: each connection gets a private one" in message
        assert "use a file, e.g. sqlite:///jobs.db" in message
        assert "pytest fixtures use a temporary one" in message


def test_a_sqlite_file_and_a_file_uri_are_accepted(tmp_path):
    for url in (f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///file:{tmp_path / 'b.db'}?uri=true"):
        engine = sa.create_engine(url)
        sqlqueue.migrate(engine)
        queue = sqlqueue.Queue(engine)
        assert queue.stats().by_status["queued"] == 0
        engine.dispose()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"lease_seconds": 0}, "lease_seconds"),
        ({"max_payload_bytes": 0}, "max_payload_bytes"),
        ({"unknown_jobs": "ignore"}, "unknown_jobs"),
        ({"default_queue": ""}, "default_queue"),
    ],
)
def test_queue_settings_are_checked_at_construction(tmp_path, options, field):
    with pytest.raises(sqlqueue.ConfigurationError, match=field):
        sqlqueue.Queue(f"sqlite:///{tmp_path / 'q.db'}", **options)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"poll_interval": 0}, "poll_interval"),
        ({"shutdown_timeout": -1}, "shutdown_timeout"),
        ({"queues": []}, "queues"),
        ({"queues": "mail"}, "queues must be a list of names"),
        ({"listen": "no"}, "listen"),
        ({"reaper_interval": 0}, "reaper_interval"),
        ({"metrics_interval": 0}, "metrics_interval"),
        ({"metrics_port": 70000}, "metrics_port"),
    ],
)
def test_worker_settings_are_checked_at_construction(tmp_path, options, field):
    queue = sqlqueue.Queue(f"sqlite:///{tmp_path / 'q.db'}")
    with pytest.raises(sqlqueue.ConfigurationError, match=field):
        queue.worker(**options)


def test_unsupported_database_names_what_is_supported():
    engine = sa.create_engine(
        "mssql+pymssql://sa@127.0.0.1/test",
        module=SimpleNamespace(paramstyle="pyformat", __version__="2.2.0"),
    )
    supported = "supported: mariadb, mysql, postgresql, sqlite"
    with pytest.raises(sqlqueue.UnsupportedDatabase, match=supported):
        sqlqueue.Queue(engine)


def test_task_options_are_checked_at_registration(tmp_path):
    queue = sqlqueue.Queue(f"sqlite:///{tmp_path / 'q.db'}")
    with pytest.raises(sqlqueue.ConfigurationError, match="max_attempts"):
        queue.task("a", max_attempts=0)(lambda: None)
    with pytest.raises(sqlqueue.ConfigurationError, match="timeout"):
        queue.task("b", timeout=0)(lambda: None)
    with pytest.raises(sqlqueue.ConfigurationError, match="jitter"):
        queue.task("c", backoff=sqlqueue.exponential(jitter=2))(lambda: None)
    queue.task("d")(lambda: None)
    with pytest.raises(sqlqueue.ConfigurationError, match="already registered"):
        queue.task("d")(lambda: None)
    time.sleep(0)


def _drain_within(queue: sqlqueue.Queue, seconds: float = 60.0) -> None:
    """Drain in a thread: a worker that crashed or hangs fails the test instead of hanging it."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            drain(queue)
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the burst worker never finished: a job kept its slot"
    assert errors == [], f"the worker crashed: {errors!r}"


def test_rows_written_around_sqlqueue_are_reported_not_fatal(backend):
    """Another service or a hand-written UPDATE may leave a payload that is not an object, or
    an error history of JSON null: the job says what is wrong (or simply runs), the worker
    goes on with the rest."""
    queue = backend.queue()
    ran: list[int] = []

    @queue.task("work")
    def work(n: int) -> None:
        ran.append(n)

    with backend.engine.begin() as conn:
        listed, nulled, plain = (queue.enqueue(conn, "work", {"n": n}) for n in range(3))
    # The column's own JSON type writes the JSON text each backend stores (jsonb or text).
    with backend.engine.begin() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.id == listed).values(payload=[1, 2]))
        conn.execute(sa.update(jobs).where(jobs.c.id == nulled).values(errors=sa.JSON.NULL))
    _drain_within(queue)
    job = queue.get_job(listed)
    assert job.status == "dead"
    assert "the payload is not a JSON object but list [1, 2]" in job.last_error
    assert queue.get_job(nulled).status == "succeeded"
    assert queue.get_job(plain).status == "succeeded"
    assert sorted(ran) == [1, 2]


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str")


class _BrokenBackoff:
    def delay(self, attempt: int) -> float:
        raise ZeroDivisionError("a buggy backoff")


def test_an_error_that_cannot_be_described_still_ends_its_attempt(backend):
    """An exception whose ``str()`` fails, or a custom backoff that raises, must still turn
    into an outcome: otherwise the job keeps its slot and lease for as long as the worker
    lives."""
    queue = backend.queue()

    @queue.task("unprintable", max_attempts=1)
    def unprintable() -> None:
        raise _Unprintable()

    @queue.task("bad_backoff", max_attempts=2, backoff=_BrokenBackoff())
    def bad_backoff() -> None:
        raise ValueError("try again")

    with backend.engine.begin() as conn:
        first = queue.enqueue(conn, "unprintable")
        second = queue.enqueue(conn, "bad_backoff")
    _drain_within(queue)
    job = queue.get_job(first)
    assert (job.status, job.last_error) == ("dead", "_Unprintable: <unprintable _Unprintable>")
    job = queue.get_job(second)
    assert (job.status, job.attempts) == ("failed", 1)  # retried later, on the default backoff
    assert job.next_run_at > job.errors[-1].at


def test_claims_decode_json_with_the_engines_deserializer(backend):
    """``create_engine(json_deserializer=…)`` is how an app reads JSON numbers as Decimal; the
    handler sees what ``get_job`` sees."""
    engine = sa.create_engine(
        backend.url, json_deserializer=lambda text: json.loads(text, parse_float=Decimal)
    )
    try:
        queue = sqlqueue.Queue(engine)
        seen: list[object] = []

        @queue.task("price")
        def price(amount: object) -> None:
            seen.append(amount)

        with engine.begin() as conn:
            job_id = queue.enqueue(conn, "price", {"amount": 9.95})
        drain(queue)
        assert seen == [Decimal("9.95")]
        job = queue.get_job(job_id)
        assert job is not None
        assert job.payload == {"amount": Decimal("9.95")}
    finally:
        engine.dispose()


def test_a_handler_raising_cancelled_error_itself_fails_like_any_error(backend):
    """``CancelledError`` from a handler (not from the worker stopping it) is the handler's
    failure: dropped as a cancellation, the job kept its lease while the worker lived."""
    queue = backend.queue()

    @queue.task("async_cancel", max_attempts=1)
    async def async_cancel() -> None:
        raise asyncio.CancelledError

    @queue.task("timed_cancel", max_attempts=1, timeout=30)  # not direct: runs through execute()
    def timed_cancel() -> None:
        raise asyncio.CancelledError

    @queue.task("plain_cancel", max_attempts=1)  # direct: runs through start_direct()
    def plain_cancel() -> None:
        raise asyncio.CancelledError

    with backend.engine.begin() as conn:
        ids = [
            queue.enqueue(conn, name) for name in ("async_cancel", "timed_cancel", "plain_cancel")
        ]
    _drain_within(queue)
    for job_id in ids:
        job = queue.get_job(job_id)
        assert (job.status, job.last_error) == ("dead", "CancelledError")
