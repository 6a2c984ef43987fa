"""The conformance harness: every test that takes ``backend`` runs on a SQLite file, on
PostgreSQL and on MariaDB/MySQL. With ``CI=true`` an unreachable server fails the run instead
of skipping."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
import tests._hypothesis  # noqa: F401  (loads the Hypothesis profile)
from sqlqueue.dialects import dialect_for
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
        conn.exec_driver_sql(create.format(name=name))
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
        create='CREATE DATABASE "{name}"',
        drop='DROP DATABASE IF EXISTS "{name}" WITH (FORCE)',
        isolation_level="AUTOCOMMIT",
    )


@pytest.fixture(scope="session")
def postgres_url(worker_id: str) -> Iterator[str]:
    """A database of its own for this test session (or xdist worker)."""
    yield from _postgres_database(worker_id)


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


def _reset_mysql(url: str) -> None:
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with engine.begin() as conn:
        tables = conn.execute(
            sa.text(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = DATABASE()"
            )
        ).scalars()
        for table in list(tables):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS `{table}`")
    engine.dispose()


def _reset_postgres(url: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        tables = conn.execute(
            sa.text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        ).scalars()
        for table in list(tables):
            conn.exec_driver_sql(f'DROP TABLE IF EXISTS "{table}" CASCADE')
    engine.dispose()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """An empty, migrated database: a SQLite file, PostgreSQL, or MariaDB/MySQL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'sqlqueue.db'}"
    elif request.param == "mysql":
        url = request.getfixturevalue("mysql_url")
        _reset_mysql(url)
    else:
        url = request.getfixturevalue("postgres_url")
        _reset_postgres(url)
    engine = sa.create_engine(url)
    sqlqueue.migrate(engine)
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
