"""The Engine form of a one-job enqueue, straight on a pooled driver connection
(``DirectStatement.committed_row``, ``can_commit_directly``, ``insert_committed``): the same
statements, commit and errors as ``engine.begin()``, and SQLAlchemy's own path whenever
anything would notice the difference."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from sqlqueue._store._direct import DirectStatement, can_commit_directly
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
