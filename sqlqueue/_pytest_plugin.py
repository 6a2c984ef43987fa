"""The pytest plugin (entry point ``sqlqueue``): a migrated queue on a temporary SQLite file
for each test.

``sqlqueue_queue`` is a fresh :class:`~sqlqueue.Queue`, or, when the app's ``conftest.py``
overrides ``sqlqueue_app_queue`` to return the app's own Queue, that very queue serving the
temporary database for the test (whatever database it was built on). ``sqlqueue_engine`` is the
database's engine, for the app's own tables and transactions. Disable with ``-p no:sqlqueue``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from sqlqueue import Queue, migrate

__all__ = ["sqlqueue_app_queue", "sqlqueue_engine", "sqlqueue_queue"]


@pytest.fixture
def sqlqueue_app_queue() -> Queue | None:
    """The app's Queue, which ``sqlqueue_queue`` makes serve the test's database; override it
    in your ``conftest.py`` (the default, ``None``, gives a fresh Queue with no tasks)."""
    return None


@pytest.fixture
def sqlqueue_engine(tmp_path: Path) -> Iterator[sa.Engine]:
    """An engine on a new SQLite file in the test's temporary directory, migrated for sqlqueue."""
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'sqlqueue.db'}")
    migrate(engine)
    try:
        yield engine
    finally:
        engine.dispose()


@pytest.fixture
def sqlqueue_queue(sqlqueue_engine: sa.Engine, sqlqueue_app_queue: Queue | None) -> Iterator[Queue]:
    """A Queue on ``sqlqueue_engine``: a fresh one, or ``sqlqueue_app_queue`` itself serving it
    for the test, whatever database it was built on.

    The app's code enqueues through the app's tasks, which belong to the app's Queue: so it is
    that object that serves the test's database (rebound in place, and given back its own
    database when the test ends), and ``task.enqueue(conn, …)`` writes SQLite SQL through the
    test's connection even when the app's Queue is on PostgreSQL or MariaDB.
    """
    if sqlqueue_app_queue is None:
        yield Queue(sqlqueue_engine)
        return
    app = sqlqueue_app_queue
    own = dict(vars(app))
    rebound = vars(app.rebind(sqlqueue_engine, schema=None))  # a file has no schemas
    vars(app).clear()
    vars(app).update(rebound, _tasks=own["_tasks"], _periodic=own["_periodic"])
    try:
        yield app
    finally:
        vars(app).clear()
        vars(app).update(own)
