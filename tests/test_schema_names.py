"""Schema names at PostgreSQL's limits: a name longer than the server takes is refused when the
Queue is built, naming the limit; two long names that share all but their last characters get
wake-up channels of their own (a channel holds 63 bytes, so a long schema's is hashed), and an
enqueue in one wakes only the other's listeners if it is theirs."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

import sqlqueue
from tests.conftest import Backend

#: Two 60-byte names, equal in their first 57: "sqlqueue." and either is past 63 bytes.
LONG_A = "q" * 57 + "_aa"
LONG_B = "q" * 57 + "_bb"


def _drop(backend: Backend) -> None:
    with backend.engine.begin() as conn:
        for schema in (LONG_A, LONG_B):
            conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def long_schemas(backend: Backend) -> Iterator[Backend]:
    """``backend`` migrated into the two long-named schemas (dropped afterwards)."""
    backend.requires("schemas")
    _drop(backend)
    try:
        for schema in (LONG_A, LONG_B):
            sqlqueue.migrate(backend.engine, schema=schema)
        yield backend
    finally:
        _drop(backend)


def test_a_schema_name_longer_than_the_server_takes_is_refused_naming_the_limit(
    backend: Backend,
) -> None:
    backend.requires("schemas")
    with pytest.raises(sqlqueue.ConfigurationError, match=r"schema must be a name of 1\.\.63"):
        sqlqueue.Queue(backend.engine, schema="s" * 64)
    with pytest.raises(sqlqueue.ConfigurationError, match=r"schema must be a name of 1\.\.63"):
        sqlqueue.Queue(backend.engine, schema="")


def test_long_schema_names_that_share_a_prefix_wake_only_their_own_workers(
    long_schemas: Backend,
) -> None:
    long_schemas.requires("listen_notify")
    engine = long_schemas.engine
    queue_a = sqlqueue.Queue(engine, schema=LONG_A)
    queue_b = sqlqueue.Queue(engine, schema=LONG_B)
    for queue in (queue_a, queue_b):
        queue.task("note", queue="notes")(lambda label: None)
    channels = {queue_a.dialect.wake_channel, queue_b.dialect.wake_channel}
    assert len(channels) == 2
    assert all(len(channel.encode()) <= 63 for channel in channels)

    heard: list[str] = []
    with queue_a.dialect.listen(engine, queue_a.dialect.wake_channel) as wait:
        with engine.begin() as conn:
            queue_b.enqueue(conn, "note", {"label": "b"}, queue="from_b")
        with engine.begin() as conn:
            queue_a.enqueue(conn, "note", {"label": "a"}, queue="from_a")
        # Notifications arrive in commit order: once a's is here, b's would have come first.
        deadline = time.monotonic() + 30
        while "from_a" not in heard and time.monotonic() < deadline:
            heard.extend(wait(0.2))
    assert heard == ["from_a"]
    assert [job.payload for job in queue_a.jobs()] == [{"label": "a"}]
    assert [job.payload for job in queue_b.jobs()] == [{"label": "b"}]
