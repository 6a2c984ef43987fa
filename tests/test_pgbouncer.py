"""PgBouncer in transaction pooling mode: worker processes drain jobs through it, polling.

The test starts Debian's ``pgbouncer`` itself (a unix socket of its own, a config, ``pool_mode =
transaction``) in front of a PostgreSQL database of its own. Through it go the migrations
(their advisory lock is transaction-scoped), enqueues (``pg_notify`` in the INSERT is only a
hint nobody listens to here), hundreds of executions of the same statements from interleaved
clients (psycopg must not prepare them: ``prepare_threshold=None``, as the README says) and
worker processes started with ``--no-listen``, counted from the ledger. The connections a worker
process holds are measured here too, on PgBouncer's side and, for comparison, on PostgreSQL's.

With ``CI=true`` a missing ``pgbouncer`` fails the run instead of skipping.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import sqlalchemy as sa

import sqlqueue
from tests._support.pgbouncer import Bouncer, running_pgbouncer
from tests.apps.ledger import create_ledger, read_ledger, register_ledger_tasks
from tests.apps.processes import WorkerProcess, child_env, wait_until
from tests.conftest import BACKENDS, _postgres_database, _reset_postgres

pytestmark = pytest.mark.timeout(120)

PGBOUNCER_APP = "tests.apps.pgbouncer_app:queue"
DIRECT_APP = "tests.apps.ledger_app:queue"
#: The engine options the README gives for PgBouncer < 1.21 (no prepared statements).
NO_PREPARE = {"prepare_threshold": None}


@pytest.fixture(scope="module")
def database_url(worker_id: str) -> Iterator[str]:
    """A PostgreSQL database of this module's own."""
    if "postgresql" not in BACKENDS:
        pytest.skip("PgBouncer fronts PostgreSQL, which SQLQUEUE_TEST_BACKENDS leaves out")
    yield from _postgres_database(f"{worker_id}_pgbouncer")


@pytest.fixture(scope="module")
def bouncer(database_url: str) -> Iterator[Bouncer]:
    """PgBouncer in transaction pooling mode in front of this module's database."""
    with running_pgbouncer(database_url) as running:
        yield running


@pytest.fixture
def engine(bouncer: Bouncer) -> Iterator[sa.Engine]:
    """An engine through PgBouncer on an empty database, migrated and with a ledger through it."""
    _reset_postgres(bouncer.direct_url)
    engine = sa.create_engine(bouncer.url, pool_pre_ping=True, connect_args=NO_PREPARE)
    sqlqueue.migrate(engine)
    create_ledger(engine)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[list[WorkerProcess]]:
    """Worker processes a test starts; whatever still runs at its end is killed."""
    started: list[WorkerProcess] = []
    try:
        yield started
    finally:
        for worker in started:
            worker.close()


def start_worker(
    started: list[WorkerProcess], tmp_path: Path, url: str, name: str, *options: str, app: str
) -> WorkerProcess:
    """``sqlqueue worker app *options`` on ``url``, connecting as ``application_name=name``."""
    env = child_env(url, PGAPPNAME=name)
    worker = WorkerProcess([app, *options], env, tmp_path / f"{name}.log")
    started.append(worker)
    return worker


def ledger_queue(engine: sa.Engine) -> sqlqueue.Queue:
    """A queue with the ledger tasks, to enqueue them."""
    queue = sqlqueue.Queue(engine)
    register_ledger_tasks(queue)
    return queue


def record(key: str) -> sqlqueue.JobRequest:
    """A no-op ledger job whose idempotency key (and payload ``key``) is ``key``."""
    return sqlqueue.JobRequest(job_type="ledger.record", payload={"key": key}, idempotency_key=key)


def succeeded(engine: sa.Engine) -> int:
    """How many jobs have succeeded."""
    query = sa.text("SELECT count(*) FROM sqlqueue_jobs WHERE status = 'succeeded'")
    with engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


def ran(engine: sa.Engine, job_id: int) -> bool:
    """Whether the ledger shows job ``job_id`` ran."""
    return any(row.job_id == job_id for row in read_ledger(engine))


def problems(worker: WorkerProcess) -> list[str]:
    """The log lines of ``worker`` that say something went wrong."""
    return [
        line
        for line in worker.log().splitlines()
        if " ERROR " in line or " WARNING " in line or "Traceback" in line
    ]


def report(capsys: pytest.CaptureFixture[str], line: str) -> None:
    """Print a measured figure even when pytest captures output."""
    with capsys.disabled():
        print(f"\n    {line}")


def test_worker_processes_drain_jobs_exactly_once_through_pgbouncer(
    bouncer, engine, processes, tmp_path, capsys
):
    queue = ledger_queue(engine)
    with engine.connect() as conn:
        assert conn.connection.driver_connection.prepare_threshold is None
    options = ("--no-listen", "--poll-interval", "0.1", "--concurrency", "4")
    names = ["pgb-worker-1", "pgb-worker-2"]
    workers = [
        start_worker(processes, tmp_path, bouncer.url, name, *options, app=PGBOUNCER_APP)
        for name in names
    ]
    for worker in workers:
        worker.wait_ready()

    # Enqueue while the workers claim: three clients interleave on PgBouncer's server
    # connections, each running the same INSERT far more often than psycopg's default
    # prepare_threshold (5) — the pattern that breaks once statements are prepared.
    per_thread, errors, ids = 60, [], []

    def enqueue(thread: int) -> None:
        try:
            for n in range(per_thread):
                with engine.begin() as conn:
                    job_id = queue.enqueue_many(conn, [record(f"t{thread}-{n}")])[0]
                assert queue.get_job(job_id) is not None
                ids.append(job_id)
        except Exception as error:
            errors.append(error)

    threads = [threading.Thread(target=enqueue, args=(n,)) for n in range(3)]
    for thread in threads:
        thread.start()
    with engine.begin() as conn:  # and one batch of many rows
        batch = queue.enqueue_many(conn, [record(f"batch-{n}") for n in range(120)])
    ids.extend(batch)
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    total = 3 * per_thread + 120

    peak: Counter[str] = Counter()

    def drained() -> bool:
        for name, count in bouncer.clients().items():
            peak[name] = max(peak[name], count)
        return succeeded(engine) == total

    wait_until(
        drained,
        timeout=30,
        what=f"{total} jobs to succeed through pgbouncer",
        explain=lambda: "\n".join(worker.describe() for worker in workers),
    )
    ledger = read_ledger(engine)
    runs = Counter(row.job_id for row in ledger)
    assert set(runs) == set(ids), "every job ran"
    assert set(runs.values()) == {1}, "no job ran twice"
    assert {row.pid for row in ledger} <= {worker.pid for worker in workers}
    for worker in workers:
        assert "wake-ups off (listen=False)" in worker.log()
        assert problems(worker) == [], worker.describe()
    for worker in workers:
        assert worker.stop(timeout=15) == 0, worker.describe()
    assert all(peak[name] <= 1 + 4 for name in names), peak
    report(
        capsys,
        f"[{bouncer.version}] {total} jobs, 2 --no-listen workers, exactly once; "
        f"peak client connections per worker while draining: "
        f"{', '.join(str(peak[name]) for name in names)}",
    )


def test_an_idle_worker_without_listen_polls_and_holds_one_connection(
    bouncer, engine, processes, tmp_path, capsys
):
    queue = ledger_queue(engine)
    poll = 0.5
    worker = start_worker(
        processes,
        tmp_path,
        bouncer.url,
        "pgb-idle",
        "--no-listen",
        "--poll-interval",
        str(poll),
        app=PGBOUNCER_APP,
    )
    worker.wait_ready()
    time.sleep(3 * poll)  # several idle polls, heartbeats and reaper passes
    assert bouncer.clients()["pgb-idle"] == 1  # the database thread's pooled connection
    direct = sa.create_engine(bouncer.direct_url, poolclass=sa.pool.NullPool)
    listening = sa.text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND query ILIKE 'LISTEN%'"
    )
    with direct.connect() as conn:
        assert conn.execute(listening).scalar_one() == 0

    latencies = []
    for n in range(3):
        begun = time.monotonic()
        with engine.begin() as conn:
            job_id = queue.enqueue_many(conn, [record(f"idle-{n}")])[0]
        wait_until(
            partial(ran, engine, job_id),
            timeout=poll + 5,
            what=f"job {n} to run",
            explain=worker.describe,
        )
        latencies.append(time.monotonic() - begun)
    # Without LISTEN only a poll picks a job up: each ran (the wait above); how soon is a figure.
    with capsys.disabled():
        print(f"\n    pickups by poll ({poll:g} s) through PgBouncer: {latencies}")
    # The database thread's connection, plus at most one the ledger handler's own write took
    # from the same pool while the database thread held its connection (jobs ran one at a time;
    # whether the two overlapped is timing, so both counts are right).
    assert bouncer.clients()["pgb-idle"] in (1, 2)
    assert problems(worker) == [], worker.describe()
    stopping = time.monotonic()
    assert worker.stop(timeout=15) == 0, worker.describe()
    direct.dispose()
    report(
        capsys,
        f"[{bouncer.version}] --no-listen worker, {poll} s poll: pickups "
        f"{', '.join(f'{latency * 1000:.0f}' for latency in latencies)} ms; "
        f"1 client connection when idle; stopped in {time.monotonic() - stopping:.2f} s",
    )


def test_a_listening_worker_holds_two_connections_on_postgresql(
    database_url, processes, tmp_path, capsys
):
    """For comparison, directly on PostgreSQL: the pooled connection plus the LISTEN one."""
    _reset_postgres(database_url)
    direct = sa.create_engine(database_url, poolclass=sa.pool.NullPool)
    sqlqueue.migrate(direct)
    worker = start_worker(processes, tmp_path, database_url, "direct-idle", app=DIRECT_APP)
    worker.wait_ready()
    held = sa.text(
        "SELECT count(*), count(*) FILTER (WHERE query ILIKE 'LISTEN%') FROM pg_stat_activity "
        "WHERE datname = current_database() AND application_name = 'direct-idle'"
    )

    def settled() -> tuple[int, int] | None:
        time.sleep(0.2)
        with direct.connect() as conn:
            total, listening = conn.execute(held).one()
        return (total, listening) if listening == 1 else None

    counts = wait_until(settled, timeout=10, what="the worker to LISTEN", explain=worker.describe)
    time.sleep(1.0)  # a few idle polls: the count stays put
    with direct.connect() as conn:
        assert tuple(conn.execute(held).one()) == counts == (2, 1)
    assert worker.stop(timeout=15) == 0, worker.describe()
    direct.dispose()
    report(capsys, "directly on PostgreSQL, an idle listening worker holds 2 connections")


def test_a_prepared_statement_clash_names_the_setting_to_change(database_url: str) -> None:
    """What a user whose pooler loses psycopg's prepared statements sees: the server's error and
    the setting that fixes it, not "cannot reach PostgreSQL"."""
    queue = sqlqueue.Queue(database_url)
    try:
        with queue.engine.connect() as conn:
            try:
                conn.exec_driver_sql("EXECUTE _pg3_0")  # as after a pooler switched sessions
            except sa.exc.DBAPIError as error:
                translated = queue.dialect.translate_error(error)
            else:  # pragma: no cover - the statement cannot exist
                pytest.fail("EXECUTE of a statement never prepared succeeded")
    finally:
        queue.engine.dispose()
    assert type(translated) is sqlqueue.DatabaseError
    assert 'prepared statement "_pg3_0" does not exist' in str(translated)
    assert 'connect_args={"prepare_threshold": None}' in str(translated)
