"""A connection to another SQLite file than the Queue's is refused before any SQL (issue 45).

The testing plugin rebinds the app's Queue to the test's own file; code that enqueued through
the app's own engine (the tutorial's ``sign_up()``) wrote the job into the developer's
database, and the test found none in its own: a SQLite connection passed the check, which
compared only the kind of database. Files are told apart by their real path; a server's
database is not (it has many names, a pooler's among them: see ``check_same_database``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlalchemy as sa

import sqlqueue
from tests._support import count_jobs
from tests._support.statements import statements


def _migrated(path: Path) -> sa.Engine:
    engine = sa.create_engine(f"sqlite:///{path}")
    sqlqueue.migrate(engine)
    return engine


def test_a_connection_to_another_file_is_refused_before_any_sql(tmp_path: Path) -> None:
    queue_engine, app_engine = _migrated(tmp_path / "test.db"), _migrated(tmp_path / "app.db")
    queue = sqlqueue.Queue(queue_engine)
    send = queue.task("send")(lambda n: None)
    try:
        with app_engine.connect() as conn:
            conn.begin()
            with (
                statements(app_engine) as sent,
                pytest.raises(sqlqueue.ConfigurationError) as raised,
            ):
                send.enqueue(conn, n=1)
            assert sent.sql == []
            conn.commit()
        with pytest.raises(sqlqueue.ConfigurationError):
            send.enqueue(app_engine, n=1)  # an engine: a transaction of sqlqueue's own
        assert str(raised.value) == (
            f"this Queue's database is the SQLite file {os.path.realpath(tmp_path / 'test.db')}, "
            f"but the connection it was given is to {os.path.realpath(tmp_path / 'app.db')}: "
            "enqueue through a "
            "connection of the Queue's engine (in tests: sqlqueue_engine, the file the "
            "sqlqueue_queue fixture serves)"
        )
        assert (count_jobs(app_engine), count_jobs(queue_engine)) == (0, 0)
    finally:
        queue_engine.dispose()
        app_engine.dispose()


def test_another_engine_on_the_same_file_is_welcome(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same file, another engine, another spelling of its path (relative, through a link)."""
    queue_engine = _migrated(tmp_path / "jobs.db")
    (tmp_path / "link").symlink_to(tmp_path)
    monkeypatch.chdir(tmp_path)
    queue = sqlqueue.Queue(queue_engine)
    send = queue.task("send")(lambda n: None)
    others = [sa.create_engine("sqlite:///jobs.db"), sa.create_engine("sqlite:///link/jobs.db")]
    try:
        for other in others:
            with other.begin() as conn:
                send.enqueue(conn, n=1)
        assert count_jobs(queue_engine) == 2
    finally:
        for engine in (queue_engine, *others):
            engine.dispose()
    assert os.path.realpath("link/jobs.db") == str((tmp_path / "jobs.db").resolve())
