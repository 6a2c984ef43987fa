"""MariaDB/MySQL's own checks in ``sqlqueue.dialects.mysql``: a server without ``SKIP LOCKED``
is refused with the versions it needs, and an async pooled connection made on another event
loop is replaced at checkout, not reused (aiomysql's connections belong to their loop)."""

from __future__ import annotations

import asyncio
import gc

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

import sqlqueue
from sqlqueue.dialects.mysql import MySQLDialect, check_server_version
from tests.conftest import BACKENDS


@pytest.mark.parametrize(
    ("version", "name"),
    [
        ("10.5.21-MariaDB-1:10.5.21+maria~ubu2004", "MariaDB 10.5.21"),
        ("5.5.5-10.4.3-MariaDB-log", "MariaDB 10.4.3"),
        ("5.7.44-log", "MySQL 5.7.44"),
        ("8.0.0", "MySQL 8.0.0"),
    ],
)
def test_a_server_without_skip_locked_is_refused_with_the_versions_needed(version, name):
    with pytest.raises(sqlqueue.UnsupportedDatabase, match=rf"^{name}.* has no SKIP LOCKED") as no:
        check_server_version(version)
    assert "sqlqueue needs MariaDB >= 10.6 or MySQL >= 8.0.1" in str(no.value)


@pytest.mark.parametrize(
    "version", ["10.6.0-MariaDB", "5.5.5-10.11.6-MariaDB-0+deb12u1", "8.0.1", "8.4.2"]
)
def test_a_server_with_skip_locked_is_accepted(version):
    check_server_version(version)


# The connection discarded from the first loop is closed by the garbage collector on a loop
# that is closed by then: aiomysql's ``__del__`` complains, harmlessly. The test collects it
# itself, so that complaint lands here, where it is expected, and not in whichever test of
# this xdist worker the collector happens to run in next.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_async_connection_pooled_by_another_event_loop_is_replaced(mysql_url):
    if "mysql" not in BACKENDS:
        pytest.skip("SQLQUEUE_TEST_BACKENDS leaves MariaDB/MySQL out")
    dialect = MySQLDialect()
    engine = create_async_engine(dialect.async_url(sa.make_url(mysql_url)))
    dialect.prepare_engine(engine.sync_engine)

    async def connection_id() -> int:
        async with engine.connect() as conn:
            return int((await conn.execute(sa.text("SELECT CONNECTION_ID()"))).scalar_one())

    try:
        first = asyncio.run(connection_id())
        # The pooled connection belongs to the first loop, closed now: a new one is opened.
        second = asyncio.run(connection_id())
        third_loop_same = asyncio.run(_twice(connection_id))
    finally:
        asyncio.run(engine.dispose(close=False))
        gc.collect()
    assert second != first
    assert third_loop_same[0] == third_loop_same[1], "within one loop the connection is reused"


async def _twice(probe):
    return await probe(), await probe()
