"""The pytest plugin (entry point ``sqlqueue``): a migrated queue on a temporary SQLite file
for each test.

``sqlqueue_queue`` is a fresh :class:`~sqlqueue.Queue`, or, when the app's ``conftest.py``
overrides ``sqlqueue_app_queue`` to return the app's own Queue, that queue with its tasks
rebound to the temporary database (:meth:`Queue.rebind`). ``sqlqueue_engine`` is the
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
    """The app's Queue, whose tasks ``sqlqueue_queue`` should carry; override it in your
    ``conftest.py`` (the default, ``None``, gives a Queue with no tasks). The app's code
    enqueues through it with its own backend's SQL: it should be a SQLite Queue in tests."""
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
def sqlqueue_queue(sqlqueue_engine: sa.Engine, sqlqueue_app_queue: Queue | None) -> Queue:
    """A Queue on ``sqlqueue_engine``: ``sqlqueue_app_queue`` rebound to it, or a fresh one."""
    if sqlqueue_app_queue is None:
        return Queue(sqlqueue_engine)
    return sqlqueue_app_queue.rebind(sqlqueue_engine, schema=None)  # a file has no schemas
