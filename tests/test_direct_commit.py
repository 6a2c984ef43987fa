"""The Engine form of a one-job enqueue, straight on a pooled driver connection
(``DirectStatement.committed_row``, ``can_commit_directly``, ``insert_committed``): the same
statements, commit and errors as ``engine.begin()``, and SQLAlchemy's own path whenever
anything would notice the difference. Also both direct forms' (with ``first_row``) handling
of connections that are gone: the pool's, as SQLAlchemy handles them."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

import sqlqueue
from sqlqueue._store._direct import DirectStatement, can_commit_directly
from tests._support.waiting import wait_until
from tests.conftest import Backend
from tests.test_direct import KEYS, PROBE, STATEMENT, _metadata


@pytest.fixture
def probe(backend: Backend) -> Iterator[sa.Engine]:
    """The backend's engine with the scratch table of ``test_direct`` (dropped afterwards)."""
    _metadata.create_all(backend.engine)
    try:
        yield backend.engine
    finally:
        _metadata.drop_all(backend.engine)


def _checked_out(engine: sa.Engine) -> int:
    pool = engine.pool
    assert isinstance(pool, sa.pool.QueuePool)
    return pool.checkedout()


def _names(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return sorted(conn.execute(sa.select(PROBE.c.name)).scalars())


def test_a_committed_row_is_written_committed_and_its_connection_pooled(probe: sa.Engine):
    direct = DirectStatement(STATEMENT, KEYS)
    assert can_commit_directly(probe)
    (job_id,) = direct.committed_row(probe, {"name": "one", "moment": datetime.now(UTC)})
    assert _checked_out(probe) == 0  # back in the pool, not held
    other = sa.create_engine(probe.url)  # another pool: sees only what was committed
    try:
        with other.connect() as conn:
            found = conn.execute(sa.select(PROBE.c.id, PROBE.c.kind)).all()
    finally:
        other.dispose()
    assert [tuple(row) for row in found] == [(job_id, "probe")]


def test_a_failed_write_is_rolled_back_wrapped_and_its_connection_reused(backend: Backend):
    """With the pool's own reset-on-return off, only the explicit rollback ends the failed
    transaction: PostgreSQL would refuse the next statement on that connection otherwise."""
    engine = sa.create_engine(backend.url, pool_size=1, max_overflow=0, pool_reset_on_return=None)
    _metadata.create_all(engine)
    try:
        direct = DirectStatement(STATEMENT, KEYS)
        row = {"name": "twice", "moment": datetime.now(UTC)}
        direct.committed_row(engine, row)
        with pytest.raises(sa_exc.IntegrityError) as raised:
            direct.committed_row(engine, row)
        assert isinstance(raised.value.orig, engine.dialect.loaded_dbapi.Error)
        assert not raised.value.connection_invalidated
        assert "[parameters:" in str(raised.value)
        assert _checked_out(engine) == 0
        direct.committed_row(engine, {"name": "after", "moment": datetime.now(UTC)})
        assert _names(engine) == ["after", "twice"]
    finally:
        _metadata.drop_all(engine)
        engine.dispose()


def _listen(event: str) -> Callable[[sa.Engine], None]:
    def on(engine: sa.Engine) -> None:
        sa.event.listen(engine, event, lambda *args, **kwargs: None)

    return on


def _echo(engine: sa.Engine) -> None:
    engine.echo = True


@pytest.mark.parametrize(
    "watch",
    [
        *(
            pytest.param(_listen(event), id=event)
            for event in (
                "begin",
                "commit",
                "rollback",
                "before_cursor_execute",
                "after_cursor_execute",
                "handle_error",
                "do_execute",
            )
        ),
        pytest.param(_echo, id="echo"),
    ],
)
def test_anything_watching_the_transaction_sends_it_through_sqlalchemy(
    backend: Backend, watch: Callable[[sa.Engine], None]
):
    engine = sa.create_engine(backend.url)
    try:
        assert can_commit_directly(engine)
        watch(engine)
        assert not can_commit_directly(engine)
    finally:
        engine.dispose()


def test_logging_options_and_connection_listeners_send_it_through_sqlalchemy(backend: Backend):
    engine = sa.create_engine(backend.url)

    def nothing(*args: object, **kwargs: object) -> None:
        return None

    try:
        assert not can_commit_directly(engine.execution_options(isolation_level="SERIALIZABLE"))
        log = logging.getLogger("sqlalchemy.engine")
        level = log.level
        log.setLevel(logging.INFO)
        try:
            assert not can_commit_directly(engine)
        finally:
            log.setLevel(level)
        sa.event.listen(sa.engine.Connection, "commit", nothing)
        try:
            assert not can_commit_directly(engine)
        finally:
            sa.event.remove(sa.engine.Connection, "commit", nothing)
        assert can_commit_directly(engine)
    finally:
        engine.dispose()


def test_an_engine_enqueue_commits_its_job_and_listeners_still_see_it(backend: Backend):
    """``queue.enqueue(engine, …)`` takes the pooled path on a plain engine (the job is
    committed, the connection back in the pool), and SQLAlchemy's path on an engine with a
    listener, which then sees the INSERT and the commit."""
    queue = backend.queue()
    job_id = queue.enqueue(backend.engine, "elsewhere", {"n": 1}, external=True)
    assert _checked_out(backend.engine) == 0
    assert queue.get_job(job_id).status == "queued"  # type: ignore[union-attr]

    watched = sa.create_engine(backend.url)
    seen: list[str] = []
    sa.event.listen(
        watched, "before_cursor_execute", lambda conn, cursor, sql, *rest: seen.append(sql)
    )
    sa.event.listen(watched, "commit", lambda conn: seen.append("COMMIT"))
    try:
        other_id = backend.queue().enqueue(watched, "elsewhere", {"n": 2}, external=True)
    finally:
        watched.dispose()
    assert any(sql.lstrip().upper().startswith("INSERT") for sql in seen)
    assert seen[-1] == "COMMIT"
    assert queue.get_job(other_id).payload == {"n": 2}  # type: ignore[union-attr]


def test_rows_with_more_than_one_statement_take_sqlalchemys_path(backend: Backend):
    """A key, a unique key or tags make an enqueue more than one INSERT: those go through
    ``engine.begin()`` and still return the first job's id for a repeated key."""
    queue = backend.queue()
    first = queue.enqueue(backend.engine, "elsewhere", idempotency_key="k", external=True)
    again = queue.enqueue(backend.engine, "elsewhere", idempotency_key="k", external=True)
    tagged = queue.enqueue(backend.engine, "elsewhere", tags=["t"], external=True)
    assert first == again
    assert [job.id for job in queue.jobs(tag="t")] == [tagged]


def test_the_engine_form_sends_the_statements_engine_begin_sends(backend: Backend):
    """Seen by the driver itself (where it can trace statements: ``sqlite3``): the same
    BEGIN, INSERT and COMMIT as ``queue.enqueue`` in ``engine.begin()``, and nothing else."""
    engine = sa.create_engine(backend.url)
    sent: list[str] = []

    def trace(dbapi_connection: object, record: object) -> None:
        start = getattr(dbapi_connection, "set_trace_callback", None)
        if start is None:
            pytest.skip("the driver cannot trace its statements")
        start(lambda sql: sent.append(sql.split(" (")[0].strip()))

    sa.event.listen(engine.pool, "connect", trace)
    try:
        queue = backend.queue()
        queue.enqueue(engine, "elsewhere", {"n": 0}, external=True)  # connects (and traces)
        sent.clear()
        queue.enqueue(engine, "elsewhere", {"n": 1}, external=True)
        engine_form = list(sent)
        sent.clear()
        with engine.begin() as conn:
            queue.enqueue(conn, "elsewhere", {"n": 2}, external=True)
        assert engine_form == sent
        assert [sql.split()[0] for sql in engine_form] == ["BEGIN", "INSERT", "COMMIT"]
    finally:
        engine.dispose()


def test_an_unreachable_database_raises_what_engine_connect_raises(
    backend: Backend, tmp_path: Path
):
    """Wrapped as SQLAlchemy wraps a failed connect, so the dialect boundary translates it
    (into ``DatabaseUnavailable``) as it does for ``engine.begin()``."""
    url = sa.make_url(backend.url)
    if url.get_backend_name() == "sqlite":
        url = url.set(database=str(tmp_path / "missing" / "dir" / "x.db"))
    else:
        url = url.set(host="127.0.0.1", port=1)
    engine = sa.create_engine(url)
    try:
        with pytest.raises(sa_exc.DBAPIError) as through_sqlalchemy:
            engine.connect()
        direct = DirectStatement(STATEMENT, KEYS)
        with pytest.raises(sa_exc.DBAPIError) as ours:
            direct.committed_row(engine, {"name": "x", "moment": datetime.now(UTC)})
    finally:
        engine.dispose()
    assert type(ours.value) is type(through_sqlalchemy.value)
    assert type(ours.value.orig) is type(through_sqlalchemy.value.orig)


def _session_id(conn: sa.Connection) -> int:
    """The server's id of ``conn``'s session (its backend pid, its MariaDB connection id)."""
    query = (
        "SELECT pg_backend_pid()" if conn.dialect.name == "postgresql" else "SELECT CONNECTION_ID()"
    )
    return int(conn.exec_driver_sql(query).scalar_one())


def _drop_sessions(backend: Backend, ids: list[int]) -> None:
    """Ends the server sessions ``ids`` as a restart would, and waits until they are gone."""
    admin = sa.create_engine(backend.url, poolclass=sa.pool.NullPool)
    postgres = backend.name == "postgresql"
    sessions = (
        "pg_stat_activity WHERE pid" if postgres else "information_schema.processlist WHERE id"
    )
    remaining = sa.text(f"SELECT count(*) FROM {sessions} IN :ids").bindparams(
        sa.bindparam("ids", expanding=True)
    )
    try:
        with admin.connect() as conn:
            for session in ids:
                if postgres:
                    conn.execute(sa.text("SELECT pg_terminate_backend(:id)"), {"id": session})
                else:
                    conn.exec_driver_sql(f"KILL {session}")

        def gone() -> bool:
            with admin.connect() as conn:  # a new snapshot each time
                return int(conn.execute(remaining, {"ids": ids}).scalar_one()) == 0

        wait_until(gone, what="the dropped sessions to end")
    finally:
        admin.dispose()


def _row(n: int) -> dict[str, object]:
    return {"name": f"row {n}", "moment": datetime.now(UTC)}


def _through_sqlalchemy(engine: sa.Engine, n: int) -> None:
    with engine.begin() as conn:
        conn.execute(STATEMENT, _row(n))


def _committed_row(engine: sa.Engine, n: int) -> None:
    DirectStatement(STATEMENT, KEYS).committed_row(engine, _row(n))


def _first_row(engine: sa.Engine, n: int) -> None:
    with engine.connect() as conn:  # not ``begin()``: a failed rollback would hide the error
        DirectStatement(STATEMENT, KEYS).first_row(conn, _row(n))
        conn.commit()


def _enqueue_in_engine_form(engine: sa.Engine, n: int) -> None:
    sqlqueue.Queue(engine).enqueue(engine, "elsewhere", external=True)


def _enqueue_in_connection_form(engine: sa.Engine, n: int) -> None:
    with engine.begin() as conn:
        sqlqueue.Queue(engine).enqueue(conn, "elsewhere", external=True)


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(_committed_row, id="committed_row"),
        pytest.param(_first_row, id="first_row"),
        pytest.param(_enqueue_in_engine_form, id="enqueue-engine"),
        pytest.param(_enqueue_in_connection_form, id="enqueue-connection"),
    ],
)
def test_after_the_server_drops_every_connection_one_write_fails_as_through_sqlalchemy(
    backend: Backend, probe: sa.Engine, write: Callable[[sa.Engine, int], None]
):
    """A server restart leaves every pooled connection stale. The first write to find one
    fails and, as SQLAlchemy's own path does, marks the pool's older connections stale, so
    each is replaced at its next checkout instead of failing a write of its own. (MariaDB's
    enqueues emulate ``RETURNING``: there only the statements themselves go direct.)"""
    if backend.name == "sqlite":
        pytest.skip("a SQLite file has no server to drop its connections")

    def failures(write: Callable[[sa.Engine, int], None], first: int) -> int:
        engine = sa.create_engine(backend.url, pool_size=5, max_overflow=0)
        sqlqueue.Queue(engine)  # prepares the engine first: on MariaDB, that empties the pool
        try:
            held = [engine.connect() for _ in range(5)]  # every pooled connection made
            ids = [_session_id(conn) for conn in held]
            for conn in held:
                conn.close()
            _drop_sessions(backend, ids)
            failed = 0
            for n in range(first, first + 6):
                try:
                    write(engine, n)
                except (sa_exc.DBAPIError, sqlqueue.DatabaseUnavailable):
                    failed += 1
            return failed
        finally:
            engine.dispose()

    assert failures(write, 0) == failures(_through_sqlalchemy, 100) == 1


def _closed_underneath(engine: sa.Engine) -> None:
    """Closes the driver connection of the engine's one pooled connection behind the pool's
    back (nothing resets it on return), as a driver does when it finds its socket gone."""
    pooled = engine.raw_connection()
    dbapi_connection = pooled.dbapi_connection
    assert dbapi_connection is not None
    dbapi_connection.close()
    pooled.close()


def _failed_committed_row(engine: sa.Engine, direct: bool) -> sa_exc.DBAPIError:
    with pytest.raises(sa_exc.DBAPIError) as raised:
        (_committed_row if direct else _through_sqlalchemy)(engine, 0)
    return raised.value


def _failed_first_row(engine: sa.Engine, direct: bool) -> sa_exc.DBAPIError:
    """No context manager: the rollback of its exit would fail too and hide the error."""
    conn = engine.connect()
    direct_statement = DirectStatement(STATEMENT, KEYS)

    def write() -> object:
        if direct:
            return direct_statement.first_row(conn, _row(0))
        return conn.execute(STATEMENT, _row(0))

    try:
        with pytest.raises(sa_exc.DBAPIError) as raised:
            write()
        assert conn.invalidated == raised.value.connection_invalidated
        return raised.value
    finally:
        with suppress(sa_exc.DBAPIError):
            conn.close()


@pytest.mark.parametrize(
    "fail",
    [
        pytest.param(_failed_committed_row, id="committed_row"),
        pytest.param(_failed_first_row, id="first_row"),
    ],
)
def test_a_closed_driver_connection_fails_as_through_sqlalchemy(
    backend: Backend, probe: sa.Engine, fail: Callable[[sa.Engine, bool], sa_exc.DBAPIError]
):
    """A driver that refuses even a cursor on its connection (psycopg and ``sqlite3`` do, once
    it is closed) fails the write as SQLAlchemy's path does: wrapped, the connection
    discarded, and the next write on a new one."""
    errors: list[sa_exc.DBAPIError] = []
    for direct in (True, False):
        engine = sa.create_engine(
            backend.url, pool_size=1, max_overflow=0, pool_reset_on_return=None
        )
        try:
            _closed_underneath(engine)
            errors.append(fail(engine, direct))
            assert _checked_out(engine) == 0
            _committed_row(engine, 10 + direct)
        finally:
            engine.dispose()
    ours, theirs = errors
    assert type(ours) is type(theirs)
    assert type(ours.orig) is type(theirs.orig)
    assert ours.connection_invalidated == theirs.connection_invalidated


_deferred_metadata = sa.MetaData()
#: A row whose foreign key is checked only at commit: its INSERT succeeds, its commit fails.
DEFERRED = sa.Table(
    "test_direct_deferred",
    _deferred_metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column(
        "parent",
        sa.Integer,
        sa.ForeignKey("test_direct_deferred.id", deferrable=True, initially="DEFERRED"),
    ),
)
ORPHAN = DEFERRED.insert().values(parent=sa.bindparam("parent")).returning(DEFERRED.c.id)


def test_a_failed_commit_is_wrapped_without_the_statement_as_sqlalchemy_wraps_it(
    backend: Backend,
):
    """SQLAlchemy wraps a failed commit with no statement and no parameters: the INSERT's
    values (a job's payload) do not belong in the commit's error."""
    if backend.name == "mysql":
        pytest.skip("MariaDB checks every constraint at once: no commit fails on one")
    engine = sa.create_engine(backend.url, pool_size=1, max_overflow=0)
    if backend.name == "sqlite":  # a pool listener: the direct path still applies

        def enforce(dbapi_connection: Any, record: object) -> None:
            dbapi_connection.execute("PRAGMA foreign_keys = ON")

        sa.event.listen(engine, "connect", enforce)
    _deferred_metadata.create_all(engine)
    try:
        assert can_commit_directly(engine)
        errors: list[sa_exc.DBAPIError] = []
        with pytest.raises(sa_exc.DBAPIError) as raised:
            DirectStatement(ORPHAN, ["parent"]).committed_row(engine, {"parent": 424242})
        errors.append(raised.value)
        assert _checked_out(engine) == 0
        with pytest.raises(sa_exc.DBAPIError) as raised, engine.begin() as conn:
            conn.execute(ORPHAN, {"parent": 424242})
        errors.append(raised.value)
        ours, theirs = errors
        assert type(ours) is type(theirs)
        assert isinstance(ours, sa_exc.IntegrityError)
        assert (ours.statement, ours.params) == (theirs.statement, theirs.params) == (None, None)
        assert "[SQL:" not in str(ours)
        assert "[parameters:" not in str(ours)
        assert not ours.connection_invalidated
        with engine.connect() as conn:  # rolled back, and the connection still usable
            assert conn.execute(sa.select(sa.func.count()).select_from(DEFERRED)).scalar() == 0
    finally:
        _deferred_metadata.drop_all(engine)
        engine.dispose()
