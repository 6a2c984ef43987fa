"""sqlqueue.testing used as an app would: assert what its code enqueued, drain the jobs in-process
through a real worker, and the pytest plugin's ``sqlqueue_queue`` fixture."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue.testing import DrainResult, assert_enqueued, drain, drain_async, enqueued_jobs
from tests._support import db_now
from tests.conftest import _reset_mysql, _reset_postgres

pytest_plugins = ["pytester"]

users = sa.Table(
    "testing_users",
    sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("email", sa.String(255), nullable=False),
)

#: A backoff no drain waits out: only ``retry_now`` brings the retry forward.
LONG_BACKOFF = [3600.0]


def _signup_app(queue: sqlqueue.Queue) -> sqlqueue.Task:
    @queue.task("welcome", queue="mail")
    def welcome(user_id: int, email: str, locale: dict[str, str]) -> None:
        pass

    @queue.task("track")
    def track(user_id: int) -> None:
        pass

    return welcome


def _sign_up(engine: sa.Engine, queue: sqlqueue.Queue, email: str) -> int:
    """The app's request path: the user row and its jobs in one transaction."""
    with engine.begin() as conn:
        user_id = conn.execute(
            sa.insert(users).values(email=email).returning(users.c.id)
        ).scalar_one()
        queue.enqueue(
            conn,
            "welcome",
            {"user_id": user_id, "email": email, "locale": {"lang": "en", "region": "GB"}},
        )
        queue.enqueue(conn, "track", {"user_id": user_id})
    return int(user_id)


# -- assert_enqueued and enqueued_jobs ---------------------------------------------------------


def test_assert_enqueued_matches_a_payload_subset_and_counts(backend):
    queue = backend.queue()
    _signup_app(queue)
    users.metadata.create_all(backend.engine)
    ada = _sign_up(backend.engine, queue, "ada@example.com")
    _sign_up(backend.engine, queue, "bob@example.com")

    (job,) = assert_enqueued(queue, "welcome", {"email": "ada@example.com"})
    assert job.payload["user_id"] == ada
    # Nested mappings match as subsets too.
    assert_enqueued(queue, "welcome", {"user_id": ada, "locale": {"lang": "en"}}, count=1)
    assert len(assert_enqueued(queue, "welcome", count=2)) == 2
    assert_enqueued(queue, "welcome", {"email": "eve@example.com"}, count=0)
    assert_enqueued(queue, "track", {"user_id": ada})

    with pytest.raises(AssertionError):
        assert_enqueued(queue, "welcome", count=1)
    with pytest.raises(AssertionError):
        assert_enqueued(queue, "welcome", {"locale": {"lang": "fr"}})
    with pytest.raises(AssertionError):
        assert_enqueued(queue, "welcome", {"locale": "en"})  # a mapping is not a string
    with pytest.raises(AssertionError):
        assert_enqueued(queue, "farewell")


def test_enqueued_jobs_lists_in_enqueue_order_whatever_their_status(backend):
    queue = backend.queue()
    _signup_app(queue)
    users.metadata.create_all(backend.engine)
    assert enqueued_jobs(queue) == []
    for name in ("a", "b", "c"):
        _sign_up(backend.engine, queue, f"{name}@example.com")

    welcomes = enqueued_jobs(queue, "welcome")
    assert [job.payload["email"] for job in welcomes] == [
        "a@example.com",
        "b@example.com",
        "c@example.com",
    ]
    assert [job.job_type for job in enqueued_jobs(queue)] == ["welcome", "track"] * 3

    drain(queue)
    assert {job.status for job in enqueued_jobs(queue)} == {sqlqueue.JobStatus.SUCCEEDED}
    assert len(enqueued_jobs(queue, "track")) == 3


def test_a_failing_assert_enqueued_shows_what_was_enqueued(backend):
    queue = backend.queue()
    _signup_app(queue)
    users.metadata.create_all(backend.engine)
    ada = _sign_up(backend.engine, queue, "ada@example.com")

    with pytest.raises(AssertionError) as failure:
        assert_enqueued(queue, "welcome", {"email": "bob@example.com"})
    message = str(failure.value)
    assert "expected at least one 'welcome' job with payload" in message
    assert '"email": "bob@example.com"' in message
    assert "found 0" in message
    assert "Enqueued (2):" in message
    locale = '"locale": {"lang": "en", "region": "GB"}'
    payload = f'{{"email": "ada@example.com", {locale}, "user_id": {ada}}}'
    assert f"welcome {payload} (queued)" in message
    assert f'track {{"user_id": {ada}}} (queued)' in message

    with pytest.raises(AssertionError, match=r"expected exactly 2 'track' job, found 1"):
        assert_enqueued(queue, "track", count=2)


def test_a_failing_assert_enqueued_on_an_empty_queue_says_so(backend):
    queue = backend.queue()
    with pytest.raises(AssertionError, match="Nothing was enqueued"):
        assert_enqueued(queue, "welcome")


# -- drain ---------------------------------------------------------------------------------------


def test_drain_runs_every_due_job_and_those_its_handlers_enqueue(backend):
    queue = backend.queue()
    ran: list[str] = []

    @queue.task("parent")
    def parent(n: int, ctx: sqlqueue.JobContext) -> None:
        ran.append(f"parent {n}")
        with ctx.transaction() as conn:
            queue.enqueue(conn, "child", {"n": n}, queue="children")

    @queue.task("child", queue="children")
    def child(n: int) -> None:
        ran.append(f"child {n}")

    with backend.engine.begin() as conn:
        for n in (1, 2):
            queue.enqueue(conn, "parent", {"n": n})

    result = drain(queue)

    assert result == DrainResult(succeeded=4)
    assert result.ran == 4
    assert sorted(ran) == ["child 1", "child 2", "parent 1", "parent 2"]
    assert drain(queue) == DrainResult(), "nothing is left to run"


def test_drain_runs_only_the_given_queues(backend):
    queue = backend.queue()
    ran: list[str] = []

    @queue.task("a", queue="first")
    def a() -> None:
        ran.append("a")

    @queue.task("b", queue="second")
    def b() -> None:
        ran.append("b")

    with backend.engine.begin() as conn:
        queue.enqueue(conn, "a")
        queue.enqueue(conn, "b")

    assert drain(queue, queues=["second"]) == DrainResult(succeeded=1)
    assert ran == ["b"]
    assert_enqueued(queue, "a")
    assert enqueued_jobs(queue, "a")[0].status == "queued"


def test_a_failed_job_waits_for_its_backoff_unless_retry_now(backend):
    queue = backend.queue()
    attempts: list[int] = []

    @queue.task("flaky", max_attempts=5, backoff=LONG_BACKOFF)
    def flaky(ctx: sqlqueue.JobContext) -> str:
        attempts.append(ctx.attempt)
        if ctx.attempt < 3:
            raise ConnectionError(f"down on attempt {ctx.attempt}")
        return "up"

    with backend.engine.begin() as conn:
        job_id = queue.enqueue(conn, "flaky")

    # Drain returns (waiting out the hour's backoff, it would not) with the retry still due
    # an hour later: it did not wait.
    assert drain(queue) == DrainResult(failed=1, waiting=1)
    job = queue.get_job(job_id)
    assert job is not None
    assert (job.status, job.attempts) == ("failed", 1)
    assert job.next_run_at > db_now(backend.engine) + timedelta(minutes=30)

    assert drain(queue, retry_now=True) == DrainResult(succeeded=1, failed=1)
    assert attempts == [1, 2, 3]
    job = queue.get_job(job_id)
    assert job is not None
    assert (job.status, job.attempts, job.result) == ("succeeded", 3, "up")
    assert [error.error for error in job.errors] == [
        "ConnectionError: down on attempt 1",
        "ConnectionError: down on attempt 2",
    ]


def test_retry_now_drains_until_the_job_is_dead(backend):
    queue = backend.queue()

    @queue.task("doomed", max_attempts=3, backoff=LONG_BACKOFF)
    def doomed() -> None:
        raise ValueError("never works")

    @queue.task("fine")
    def fine() -> None:
        pass

    with backend.engine.begin() as conn:
        doomed_id = queue.enqueue(conn, "doomed")
        queue.enqueue(conn, "fine")

    assert drain(queue, retry_now=True) == DrainResult(succeeded=1, failed=2, dead=1)
    job = queue.get_job(doomed_id)
    assert job is not None
    assert (job.status, job.attempts, job.last_error) == ("dead", 3, "ValueError: never works")


def test_a_permanent_error_is_dead_at_once(backend):
    queue = backend.queue()

    @queue.task("bad_input")
    def bad_input() -> None:
        raise sqlqueue.PermanentError("no such user")

    with backend.engine.begin() as conn:
        queue.enqueue(conn, "bad_input")

    assert drain(queue) == DrainResult(dead=1)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_a_handler_past_its_timeout_fails_as_on_a_worker(backend, kind):
    queue = backend.queue()

    if kind == "async":

        @queue.task("slow", timeout=0.2, max_attempts=1)
        async def slow_async() -> None:
            await asyncio.sleep(3600)  # only the timeout can end it while the test runs

    else:

        @queue.task("slow", timeout=0.2, max_attempts=1)
        def slow_sync(ctx: sqlqueue.JobContext) -> None:
            deadline = time.monotonic() + 3600  # only the timeout can end it in the test
            while not ctx.cancelled and time.monotonic() < deadline:
                time.sleep(0.01)

    with backend.engine.begin() as conn:
        job_id = queue.enqueue(conn, "slow")

    assert drain(queue) == DrainResult(dead=1)
    job = queue.get_job(job_id)
    assert job is not None
    assert job.status == "dead"
    assert job.last_error is not None
    assert job.last_error.startswith("JobTimeout")


def test_a_handler_gets_its_job_context_and_commits_with_its_outcome(backend):
    queue = backend.queue()
    notes = sa.Table(
        "testing_notes",
        sa.MetaData(),
        sa.Column("job_id", sa.Integer, primary_key=True),
        sa.Column("note", sa.String(100), nullable=False),
    )
    notes.metadata.create_all(backend.engine)
    seen: list[tuple[int, str, str, int]] = []

    @queue.task("note", queue="notes", max_attempts=2, backoff=LONG_BACKOFF)
    def note(text: str, ctx: sqlqueue.JobContext) -> None:
        seen.append((ctx.job_id, ctx.job_type, ctx.queue, ctx.attempt))
        with ctx.transaction() as conn:
            conn.execute(sa.insert(notes).values(job_id=ctx.job_id, note=text))
            if ctx.attempt == 1:
                raise sqlqueue.Retry(reason="the first write rolls back")

    with backend.engine.begin() as conn:
        job_id = queue.enqueue(conn, "note", {"text": "hello"})

    assert drain(queue, retry_now=True) == DrainResult(succeeded=1, failed=1)
    assert seen == [(job_id, "note", "notes", 1), (job_id, "note", "notes", 2)]
    with backend.engine.connect() as conn:
        assert conn.execute(sa.select(notes.c.job_id, notes.c.note)).all() == [(job_id, "hello")]


def test_an_async_handler_runs_on_the_workers_loop(backend):
    queue = backend.queue()
    results: list[int] = []

    @queue.task("double")
    async def double(n: int) -> int:
        await asyncio.sleep(0)
        results.append(n * 2)
        return n * 2

    with backend.engine.begin() as conn:
        ids = [queue.enqueue(conn, "double", {"n": n}) for n in (1, 2, 3)]

    assert drain(queue, concurrency=3) == DrainResult(succeeded=3)
    assert sorted(results) == [2, 4, 6]
    assert [job.result for job in map(queue.get_job, ids) if job] == [2, 4, 6]


def test_a_snoozed_job_is_counted_and_left_waiting(backend):
    queue = backend.queue()

    @queue.task("later")
    def later() -> None:
        raise sqlqueue.Snooze(3600)

    with backend.engine.begin() as conn:
        job_id = queue.enqueue(conn, "later")

    assert drain(queue) == DrainResult(snoozed=1, waiting=1)
    job = queue.get_job(job_id)
    assert job is not None
    assert (job.status, job.attempts) == ("queued", 0)


def test_retry_now_runs_a_snoozed_job_again_until_it_is_done(backend):
    queue = backend.queue()
    ready = {"export": False}
    calls: list[str] = []

    @queue.task("publish")
    def publish() -> None:  # waits for the export, as a real handler would
        calls.append("publish")
        if not ready["export"]:
            raise sqlqueue.Snooze(3600, reason="the export is not ready")

    @queue.task("export", priority=1)  # runs after publish's first attempt
    def export() -> None:
        calls.append("export")
        ready["export"] = True

    with backend.engine.begin() as conn:
        publish_id = queue.enqueue(conn, "publish")
        queue.enqueue(conn, "export")

    assert drain(queue, retry_now=True) == DrainResult(succeeded=2, snoozed=1)
    assert calls == ["publish", "export", "publish"]
    job = queue.get_job(publish_id)
    assert job is not None
    assert (job.status, job.attempts) == ("succeeded", 1)


def test_retry_now_gives_up_on_a_job_that_always_snoozes_and_leaves_delayed_jobs(backend):
    queue = backend.queue()
    attempts: list[int] = []

    @queue.task("never")
    def never() -> None:
        attempts.append(1)
        raise sqlqueue.Snooze(3600)

    @queue.task("tomorrow")
    def tomorrow() -> None:
        raise AssertionError("a job enqueued with a delay is not due")

    with backend.engine.begin() as conn:
        never_id = queue.enqueue(conn, "never")
        queue.enqueue(conn, "tomorrow", delay=86_400)

    result = drain(queue, retry_now=True)
    assert result.waiting == 2
    assert result.snoozed == len(attempts) == 11  # the first round, then 10 of only snoozes
    job = queue.get_job(never_id)
    assert job is not None
    assert (job.status, job.attempts) == ("queued", 0)


def test_drain_async_serves_inside_a_running_loop(backend):
    queue = backend.queue()

    @queue.task("ping")
    async def ping() -> str:
        return "pong"

    with backend.engine.begin() as conn:
        job_id = queue.enqueue(conn, "ping")

    async def an_async_test() -> DrainResult:
        return await drain_async(queue)

    assert asyncio.run(an_async_test()) == DrainResult(succeeded=1)
    job = queue.get_job(job_id)
    assert job is not None
    assert job.result == "pong"


def test_drain_refuses_a_string_for_queues(backend):
    with pytest.raises(sqlqueue.ConfigurationError, match="list of names"):
        drain(backend.queue(), queues="mail")


def test_assert_enqueued_refuses_a_negative_count(backend):
    with pytest.raises(sqlqueue.ConfigurationError, match="count must be >= 0"):
        assert_enqueued(backend.queue(), "welcome", count=-1)


# -- the pytest plugin -------------------------------------------------------------------------


def test_the_fixture_is_a_migrated_queue_on_a_temporary_sqlite_file(sqlqueue_queue, tmp_path):
    assert sqlqueue_queue.engine.url.get_backend_name() == "sqlite"
    assert str(tmp_path) in str(sqlqueue_queue.engine.url.database)
    assert sqlqueue_queue.tasks == {}
    assert enqueued_jobs(sqlqueue_queue) == []


APP = '''
"""A small app: its queue is built at import, on its production database."""

import sqlalchemy as sa
import sqlqueue

queue = sqlqueue.Queue(sa.create_engine("sqlite:///production-never-touched.db"))
users = sa.Table(
    "users", sa.MetaData(),
    sa.Column("id", sa.Integer, primary_key=True), sa.Column("email", sa.String(255)),
)
sent = []


@queue.task("welcome_email", max_attempts=2, backoff=[3600])
def welcome_email(user_id, ctx: sqlqueue.JobContext):
    if ctx.attempt == 1:
        raise ConnectionError("SMTP busy")
    sent.append(user_id)


def sign_up(engine, email):
    with engine.begin() as conn:
        user_id = conn.execute(users.insert().values(email=email)).inserted_primary_key[0]
        queue.enqueue(conn, "welcome_email", {"user_id": user_id})
    return user_id
'''

APP_TESTS = """
import pytest
import myapp
from sqlqueue.testing import DrainResult, assert_enqueued, drain


@pytest.fixture
def sqlqueue_app_queue():
    return myapp.queue


def test_sign_up_enqueues_the_welcome_email(sqlqueue_queue, sqlqueue_engine):
    myapp.users.metadata.create_all(sqlqueue_engine)
    user_id = myapp.sign_up(sqlqueue_engine, "ada@example.com")

    assert_enqueued(sqlqueue_queue, "welcome_email", {"user_id": user_id}, count=1)
    assert drain(sqlqueue_queue) == DrainResult(failed=1, waiting=1)
    assert drain(sqlqueue_queue, retry_now=True) == DrainResult(succeeded=1)
    assert myapp.sent == [user_id]


def test_each_test_gets_its_own_database(sqlqueue_queue):
    assert_enqueued(sqlqueue_queue, "welcome_email", count=0)


def test_a_wrong_expectation_shows_the_jobs(sqlqueue_queue, sqlqueue_engine):
    myapp.users.metadata.create_all(sqlqueue_engine)
    myapp.sign_up(sqlqueue_engine, "bob@example.com")
    assert_enqueued(sqlqueue_queue, "welcome_email", {"user_id": 99})
"""

FRESH_QUEUE_TESTS = """
from sqlqueue.testing import DrainResult, assert_enqueued, drain


def test_a_fresh_queue_takes_its_own_tasks(sqlqueue_queue):
    @sqlqueue_queue.task("hello")
    def hello(name):
        return f"hello {name}"

    with sqlqueue_queue.engine.begin() as conn:
        job_id = sqlqueue_queue.enqueue(conn, "hello", {"name": "Ada"})
    assert drain(sqlqueue_queue) == DrainResult(succeeded=1)
    assert sqlqueue_queue.get_job(job_id).result == "hello Ada"
    assert_enqueued(sqlqueue_queue, "hello", {"name": "Ada"})
"""


def test_the_plugin_serves_an_apps_tests_with_its_own_queue(pytester):
    pytester.makepyfile(myapp=APP, test_myapp=APP_TESTS)

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")

    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*expected at least one 'welcome_email' job with payload * {\"user_id\": 99}, found 0.",
            "*Enqueued (1):",
            '*#1 welcome_email {"user_id": 1} (queued)',
        ]
    )
    assert not (pytester.path / "production-never-touched.db").exists()


SERVER_APP = '''
"""An app whose Queue is on its PostgreSQL or MariaDB database, built at import."""

import os

import sqlalchemy as sa
import sqlqueue

engine = sa.create_engine(os.environ["APP_DATABASE_URL"])
queue = sqlqueue.Queue(engine)
ran = []


@queue.task("welcome")
def welcome(user_id: int) -> None:
    ran.append(user_id)


def sign_up(conn, user_id):
    welcome.enqueue(conn, user_id=user_id)  # through the app's task, as app code does
'''

SERVER_APP_TESTS = """
import pytest
import sqlqueue
import myapp
from sqlqueue.testing import DrainResult, assert_enqueued, drain


@pytest.fixture
def sqlqueue_app_queue():
    return myapp.queue


def test_the_apps_own_queue_serves_the_tests_database(sqlqueue_queue, sqlqueue_engine):
    assert sqlqueue_queue is myapp.queue
    assert sqlqueue_queue.engine is sqlqueue_engine
    with sqlqueue_engine.begin() as conn:
        myapp.sign_up(conn, 7)
    assert_enqueued(sqlqueue_queue, "welcome", {"user_id": 7}, count=1)
    assert drain(sqlqueue_queue) == DrainResult(succeeded=1)
    assert myapp.ran == [7]


def test_a_connection_to_the_apps_own_database_is_refused_clearly(sqlqueue_queue):
    with myapp.engine.begin() as conn:
        with pytest.raises(sqlqueue.ConfigurationError) as refused:
            myapp.sign_up(conn, 8)
    assert str(refused.value).startswith(
        "this Queue writes sqlite SQL, but the connection it was given is to a "
    )
    assert "sqlqueue_engine" in str(refused.value)


def test_the_app_has_its_queue_back_after_each_test():
    assert myapp.queue.engine is myapp.engine
    assert myapp.queue.get_job(1) is None  # reads its own database again
"""


@pytest.mark.parametrize("server", ["postgres_url", "mysql_url"])
def test_the_plugin_serves_an_app_whose_queue_is_on_a_database_server(
    pytester, request, monkeypatch, server
):
    url = request.getfixturevalue(server)
    # The session's database: emptied first, so the app's "own" database has no job an earlier
    # test on this worker left behind (the inner test reads job 1 there and expects none).
    (_reset_mysql if server == "mysql_url" else _reset_postgres)(url)
    sqlqueue.migrate(url)
    server_queue = sqlqueue.Queue(url)
    before = server_queue.jobs(limit=1)
    pytester.makepyfile(myapp=SERVER_APP, test_myapp=SERVER_APP_TESTS)
    monkeypatch.setenv("APP_DATABASE_URL", url)

    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")

    result.assert_outcomes(passed=3)
    assert server_queue.jobs(limit=1) == before  # the app's own database was never written to
    server_queue.engine.dispose()


def test_the_plugin_gives_a_fresh_queue_by_default(pytester):
    pytester.makepyfile(test_fresh=FRESH_QUEUE_TESTS)

    pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q").assert_outcomes(passed=1)


def test_the_plugin_can_be_turned_off(pytester):
    pytester.makepyfile(test_fresh=FRESH_QUEUE_TESTS)

    result = pytester.runpytest_subprocess("-p", "no:sqlqueue", "-p", "no:cacheprovider", "-q")

    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'sqlqueue_queue' not found*"])
