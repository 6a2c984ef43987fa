"""The conformance harness: every test that takes ``backend`` runs on a SQLite file, on
PostgreSQL and on MariaDB/MySQL. With ``CI=true`` an unreachable server fails the run instead
of skipping."""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
import tests._hypothesis  # noqa: F401  (registers and loads the Hypothesis profiles)
from sqlqueue.dialects import dialect_for
from tests._support import drivers  # noqa: F401  (imported before any test: see there)
from tests._support.databases import (
    ServerSchema,
    copy_sqlite_template,
    drop_tables,
    migrated_sqlite_template,
)
from tests.apps.processes import Workers

POSTGRES_URL = os.environ.get(
    "SQLQUEUE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("SQLQUEUE_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
#: Which backends the conformance suite runs on (comma-separated); all three by default.
BACKENDS = [
    name.strip()
    for name in os.environ.get("SQLQUEUE_TEST_BACKENDS", "sqlite,postgresql,mysql").split(",")
    if name.strip()
]


@dataclass
class Backend:
    """A migrated, empty database for one test: its name, URL and engine."""

    name: str
    url: str
    engine: sa.Engine

    def capable(self, capability: str) -> bool:
        """Whether the backend's dialect has ``supports_<capability>``."""
        return bool(getattr(dialect_for(self.engine), f"supports_{capability}"))

    def requires(self, capability: str) -> None:
        """Skip the calling test unless the backend has ``capability``."""
        if not self.capable(capability):
            pytest.skip(f"{self.name} lacks {capability}")

    def queue(self, **options: object) -> sqlqueue.Queue:
        """A fresh Queue on this backend's engine."""
        return sqlqueue.Queue(self.engine, **options)  # type: ignore[arg-type]


def _server_database(
    label: str, admin_url: str, worker: str, *, create: str, drop: str, **engine_options: Any
) -> Iterator[str]:
    """A new database of its own on the server at ``admin_url`` (``create``/``drop`` format
    ``{name}``), dropped afterwards. Unreachable: skipped, or failed with ``CI=true``. No pooled
    connections: they would go stale across the soak's server restart."""
    admin = sa.create_engine(admin_url, poolclass=sa.pool.NullPool, **engine_options)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except sa.exc.OperationalError as error:
        message = f"{label} is unreachable at {admin_url}: {error.orig}"
        admin.dispose()
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    name = f"sqlqueue_test_{worker}_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        for statement in create.format(name=name).split("; "):
            conn.exec_driver_sql(statement)
    url = sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(drop.format(name=name))
        admin.dispose()


def _postgres_database(worker: str) -> Iterator[str]:
    return _server_database(
        "PostgreSQL",
        POSTGRES_URL,
        worker,
        # A throwaway database: commits need not wait for the disk (never the product's default).
        create='CREATE DATABASE "{name}"; ALTER DATABASE "{name}" SET synchronous_commit = off',
        drop='DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
        isolation_level="AUTOCOMMIT",
    )


@pytest.fixture(scope="session")
def postgres_url(worker_id: str) -> Iterator[str]:
    """A database of its own for this test session (or xdist worker)."""
    yield from _postgres_database(worker_id)


#: Run the tests marked ``backend_independent`` on every backend too (``nox -s independent``).
EVERY_BACKEND = os.environ.get("SQLQUEUE_TEST_EVERY_BACKEND", "").lower() in {"1", "true", "yes"}


#: CPython 3.11 under a tracer or profiler (``coverage run``, a debugger): an exception raised in a
#: thread by ``PyThreadState_SetAsyncExc`` stalls every other thread until the target thread
#: runs Python again (coveragepy#1626; 3.10, 3.12 and 3.13 are not affected). A worker that
#: interrupts a handler blocked in ``time.sleep`` or a socket read then stops serving until the
#: call returns, so the tests marked ``interrupts_handler_threads`` cannot pass there.
TRACED_ON_311 = sys.version_info[:2] == (3, 11) and (
    os.environ.get("COVERAGE_RUN") == "true" or sys.gettrace() is not None
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "interrupts_handler_threads: a worker interrupts a sync handler that is blocked "
        "(timeout, cancel, release at shutdown); skipped on CPython 3.11 under a tracer "
        "(coverage, a debugger), where that stalls the worker's other threads (coveragepy#1626)",
    )
    config.addinivalue_line(
        "markers",
        "backend_independent(reason): the test's subject is not the database (a browser, a "
        "protocol, framework glue): it runs on the first backend of SQLQUEUE_TEST_BACKENDS "
        "only, unless SQLQUEUE_TEST_EVERY_BACKEND=1 (tests/test_backend_independence.py "
        "checks what such a test may do)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A ``backend_independent`` test runs on one backend, not each of them: its other
    parametrizations are deselected. Under a tracer on CPython 3.11 the tests marked
    ``interrupts_handler_threads`` are skipped (see ``TRACED_ON_311``)."""
    if TRACED_ON_311:
        stalls = pytest.mark.skip(
            reason="CPython 3.11 under a tracer stalls every thread while an interrupted "
            "handler blocks (coveragepy#1626); this test runs in the default suite"
        )
        for item in items:
            if item.get_closest_marker("interrupts_handler_threads") is not None:
                item.add_marker(stalls)
    if EVERY_BACKEND:
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        chosen = callspec.params.get("backend", BACKENDS[0]) if callspec else BACKENDS[0]
        marked = item.get_closest_marker("backend_independent") is not None
        (drop if marked and chosen != BACKENDS[0] else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def worker_id() -> str:
    """The xdist worker name, or ``main`` without xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def _mysql_database(worker: str) -> Iterator[str]:
    return _server_database(
        "MariaDB/MySQL",
        MYSQL_URL,
        worker,
        create="CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
        drop="DROP DATABASE IF EXISTS `{name}`",
    )


@pytest.fixture(scope="session")
def mysql_url(worker_id: str) -> Iterator[str]:
    """A MariaDB/MySQL database of its own for this test session (or xdist worker)."""
    yield from _mysql_database(worker_id)


def _kept_schema(url: str) -> Iterator[ServerSchema]:
    schema = ServerSchema(url)
    try:
        yield schema
    finally:
        schema.close()


@pytest.fixture(scope="session")
def postgres_schema(postgres_url: str) -> Iterator[ServerSchema]:
    """The worker's PostgreSQL database, migrated once and cleaned before each test."""
    yield from _kept_schema(postgres_url)


@pytest.fixture(scope="session")
def mysql_schema(mysql_url: str) -> Iterator[ServerSchema]:
    """The worker's MariaDB/MySQL database, migrated once and cleaned before each test."""
    yield from _kept_schema(mysql_url)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated once per test worker, copied for each test."""
    return migrated_sqlite_template(tmp_path_factory.mktemp("template") / "sqlqueue.db")


def _drop_tables(url: str) -> None:
    """Drop every table of the server database at ``url`` (an unmigrated database)."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        drop_tables(conn)
    engine.dispose()


#: What the tests that want an unmigrated database call, by the server they use.
_reset_postgres = _reset_mysql = _drop_tables


def migrated_url(request: pytest.FixtureRequest, name: str, tmp_path: Path) -> str:
    """The URL of a migrated, empty database of backend ``name`` for the requesting test."""
    if name == "sqlite":
        path = tmp_path / "sqlqueue.db"
        copy_sqlite_template(request.getfixturevalue("sqlite_template"), path)
        return f"sqlite:///{path}"
    schema: ServerSchema = request.getfixturevalue(
        "mysql_schema" if name == "mysql" else "postgres_schema"
    )
    schema.prepare()
    return schema.url


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """An empty, migrated database: a SQLite file, PostgreSQL, or MariaDB/MySQL. Migrated
    once per test worker; each test starts from emptied tables (tests/_support/databases.py)."""
    url = migrated_url(request, request.param, tmp_path)
    engine = sa.create_engine(url)
    try:
        yield Backend(name=request.param, url=url, engine=engine)
    finally:
        engine.dispose()


@pytest.fixture
def workers(backend: Backend, tmp_path: Path) -> Iterator[Workers]:
    """Starts real worker processes on ``backend``; kills any still running when the test
    ends."""
    started = Workers(backend.url, tmp_path)
    try:
        yield started
    finally:
        started.close()
