"""Fresh, migrated databases for each measurement, and the facts that make figures comparable.

Every measurement gets a database of its own: a new SQLite file (WAL, as sqlqueue sets it) in a
temporary directory, or a new PostgreSQL database created next to the one ``--postgres-url``
names and dropped afterwards (the role needs ``CREATEDB``), or likewise a new MariaDB/MySQL
database next to ``--mysql-url``'s.
"""

from __future__ import annotations

import os
import platform
import secrets
import sqlite3
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import sqlqueue

__all__ = [
    "BACKENDS",
    "DEFAULT_MYSQL_URL",
    "DEFAULT_POSTGRES_URL",
    "ROOT",
    "Target",
    "environment",
    "filesystem",
    "fresh_database",
    "git_commit",
    "postgres_dsn",
    "sqlite_path",
]

#: The repository root: worker processes run there, with it on PYTHONPATH, to import ``bench``.
ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ("sqlite", "postgresql", "mysql")
DEFAULT_POSTGRES_URL = os.environ.get(
    "SQLQUEUE_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)
DEFAULT_MYSQL_URL = os.environ.get(
    "SQLQUEUE_TEST_MYSQL_URL", "mysql+pymysql://root@127.0.0.1:3306/test"
)


@dataclass(frozen=True, kw_only=True)
class Target:
    """Where fresh databases are made: the PostgreSQL and MariaDB/MySQL servers and the SQLite
    directory."""

    postgres_url: str
    sqlite_dir: Path | None = None
    mysql_url: str = DEFAULT_MYSQL_URL


def sqlite_path(url: str) -> str:
    """The file of a SQLite URL."""
    return sa.make_url(url).database or ""


def postgres_dsn(url: str) -> str:
    """A libpq connection string (for psycopg) from a SQLAlchemy PostgreSQL URL."""
    return sa.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextmanager
def _fresh_sqlite(directory: Path | None) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="sqlqueue-bench-", dir=directory) as scratch:
        yield f"sqlite:///{Path(scratch) / 'bench.db'}"


@contextmanager
def _fresh_postgres(admin_url: str) -> Iterator[str]:
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"sqlqueue_bench_{secrets.token_hex(4)}"  # generated here: safe to quote into DDL
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except sa.exc.OperationalError as error:
        admin.dispose()
        raise SystemExit(
            f"PostgreSQL is unreachable at {admin_url} ({error.orig}); start it, pass "
            "--postgres-url, or run with --backends sqlite"
        ) from None
    try:
        yield sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@contextmanager
def _fresh_mysql(admin_url: str) -> Iterator[str]:
    admin = sa.create_engine(admin_url, poolclass=sa.pool.NullPool)
    name = f"sqlqueue_bench_{secrets.token_hex(4)}"  # generated here: safe to quote into DDL
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    except sa.exc.OperationalError as error:
        admin.dispose()
        raise SystemExit(
            f"MariaDB/MySQL is unreachable at {admin_url} ({error.orig}); start it, pass "
            "--mysql-url, or run with --backends sqlite,postgresql"
        ) from None
    try:
        yield sa.make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        admin.dispose()


@contextmanager
def fresh_database(backend: str, target: Target) -> Iterator[str]:
    """A new database migrated to sqlqueue's schema; yields its SQLAlchemy URL."""
    maker = (
        _fresh_sqlite(target.sqlite_dir)
        if backend == "sqlite"
        else _fresh_mysql(target.mysql_url)
        if backend == "mysql"
        else _fresh_postgres(target.postgres_url)
    )
    with maker as url:
        engine = sa.create_engine(url)
        try:
            sqlqueue.migrate(engine)
        finally:
            engine.dispose()
        yield url


# -- facts ---------------------------------------------------------------------------------------


def _durability(backend: str, target: Target) -> dict[str, str]:
    """The settings that decide what a commit costs, read through sqlqueue's own engine."""
    with fresh_database(backend, target) as url:
        queue = sqlqueue.Queue(url)
        try:
            with queue.engine.connect() as conn:
                if backend == "sqlite":
                    pragmas = ("journal_mode", "synchronous", "busy_timeout")
                    values = {n: conn.exec_driver_sql(f"PRAGMA {n}").scalar() for n in pragmas}
                    level = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}
                    values["synchronous"] = level.get(int(values["synchronous"] or 0), "?")
                    return {name: str(value) for name, value in values.items()}
                if backend == "mysql":
                    variables = (
                        "version",
                        "innodb_flush_log_at_trx_commit",
                        "sync_binlog",
                        "innodb_buffer_pool_size",
                        "max_connections",
                    )
                    return {
                        n: str(conn.exec_driver_sql(f"SELECT @@{n}").scalar()) for n in variables
                    }
                names = (
                    "server_version",
                    "synchronous_commit",
                    "fsync",
                    "wal_sync_method",
                    "full_page_writes",
                    "shared_buffers",
                    "max_connections",
                )
                return {n: str(conn.exec_driver_sql(f"SHOW {n}").scalar()) for n in names}
        finally:
            queue.engine.dispose()


def filesystem(path: Path) -> str:
    """The file system type holding ``path`` (tmpfs makes SQLite's fsync free)."""
    try:
        mounts = Path("/proc/mounts").read_text(encoding="utf-8").splitlines()
    except OSError:
        return "unknown"
    best, kind = "", "unknown"
    resolved = str(path.resolve())
    for line in mounts:
        parts = line.split()
        if len(parts) >= 3 and resolved.startswith(parts[1]) and len(parts[1]) > len(best):
            best, kind = parts[1], parts[2]
    return kind


def git_commit() -> str:
    """The checked-out commit, with ``+changes`` when tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            # Read-only: --no-optional-locks keeps status from refreshing the index file.
            ["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{head}{'+changes' if dirty else ''}"


def environment(backends: list[str], target: Target) -> dict[str, Any]:
    """Versions, durability settings and load: what a figure depends on besides the code."""
    import psycopg

    sqlite_dir = target.sqlite_dir or Path(tempfile.gettempdir())
    facts: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlalchemy": sa.__version__,
        "psycopg": psycopg.__version__,
        "sqlqueue": sqlqueue.__version__,
        "sqlqueue_commit": git_commit(),
        "sqlite_library": sqlite3.sqlite_version,
        "sqlite_filesystem": filesystem(sqlite_dir),
        "durability": {backend: _durability(backend, target) for backend in backends},
    }
    return facts
