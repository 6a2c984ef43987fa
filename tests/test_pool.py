"""Pooled connections of a URL-built engine are checked at checkout without a round trip, pinged
only after sitting idle, and replaced when the server dropped them."""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa

import sqlqueue
from sqlqueue._liveness import check_connections_at_checkout
from sqlqueue.dialects import dialect_for
from tests._support import wait_until


def _counting_pings(engine: sa.Engine) -> list[object]:
    pings: list[object] = []
    ping = engine.dialect.do_ping

    def counted(dbapi_connection: Any) -> bool:
        pings.append(dbapi_connection)
        return ping(dbapi_connection)

    engine.dialect.do_ping = counted  # type: ignore[method-assign]
    return pings


def test_only_connections_idle_for_a_while_are_pinged(backend):
    engine = sa.create_engine(backend.url)
    try:
        # A second: twenty local round trips in a row take far less, even on a busy machine.
        check_connections_at_checkout(engine, dialect_for(engine), ping_after_idle=1.0)
        pings = _counting_pings(engine)
        for _ in range(20):
            with engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
        assert pings == [], "busy connections cost no round trip"
        time.sleep(1.0)  # idle for the limit (a sleep never ends early)
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        assert len(pings) == 1, "a connection idle past the limit is pinged once"
    finally:
        engine.dispose()


def test_a_connection_that_fails_its_ping_is_replaced(backend):
    engine = sa.create_engine(backend.url)
    try:
        check_connections_at_checkout(engine, dialect_for(engine), ping_after_idle=0.0)
        with engine.connect() as conn:
            first = conn.connection.dbapi_connection

        def fail(dbapi_connection: object) -> bool:
            raise RuntimeError("no answer")

        engine.dialect.do_ping = fail  # type: ignore[method-assign]
        with engine.connect() as conn:
            assert conn.connection.dbapi_connection is not first
            assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1
    finally:
        engine.dispose()


def test_a_backend_the_server_terminated_is_replaced_without_a_ping(postgres_url):
    """PostgreSQL: the server's farewell on the socket is noticed at checkout."""
    queue = sqlqueue.Queue(postgres_url)
    admin = sa.create_engine(postgres_url, poolclass=sa.pool.NullPool)
    pings = _counting_pings(queue.engine)
    try:
        with queue.engine.connect() as conn:
            pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()
        with admin.begin() as conn:
            conn.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})

        def exited() -> bool:  # then its farewell is on the socket
            with admin.connect() as conn:  # a new snapshot of pg_stat_activity each time
                query = sa.text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid")
                return int(conn.execute(query, {"pid": pid}).scalar_one()) == 0

        wait_until(exited, what="the terminated backend to exit")
        with queue.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one() != pid
        assert pings == []
    finally:
        admin.dispose()
        queue.engine.dispose()


def test_a_url_built_queue_does_not_ping_each_checkout(postgres_url):
    queue = sqlqueue.Queue(postgres_url)
    pings = _counting_pings(queue.engine)
    try:
        for _ in range(10):
            with queue.engine.begin() as conn:
                conn.execute(sa.text("SELECT 1"))
        assert pings == []
    finally:
        queue.engine.dispose()


def test_sqlite_connections_opened_before_the_queue_are_not_kept_unconfigured(tmp_path):
    """An app that used its engine first (create_all, a query) had that connection pooled without
    WAL or the busy timeout, and enqueues on it failed with "database is locked" under load."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'app.db'}")
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")  # pooled before sqlqueue saw the engine
    sqlqueue.Queue(engine)

    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    engine.dispose()
