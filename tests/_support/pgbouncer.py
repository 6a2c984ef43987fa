"""A real PgBouncer for the tests: Debian's ``pgbouncer`` started here in ``pool_mode =
transaction`` on a unix socket of its own (no TCP port to find free or race for), in front of
a PostgreSQL database of the caller's.

``tests/test_pgbouncer.py`` runs workers through it; the PgBouncer guide's samples
(``tests/test_docs_samples.py``) run their engine through it. A missing ``pgbouncer`` skips
the caller, or fails it with ``CI=true``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests._support.waiting import wait_until

__all__ = ["SOCKET_PORT", "Bouncer", "pgbouncer_binary", "running_pgbouncer"]

#: The port number PgBouncer names its socket file after (``.s.PGSQL.6432``): it listens on a
#: unix socket in a directory of its own only, so there is no TCP port to find free or race for.
SOCKET_PORT = 6432


def pgbouncer_binary() -> str:
    """Debian installs it in /usr/sbin, which a non-root PATH may not include."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    found = shutil.which("pgbouncer", path=path)
    if found is None:
        message = "pgbouncer is not installed (apt-get install pgbouncer)"
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return found


@dataclass(frozen=True)
class Bouncer:
    """A running PgBouncer in transaction mode in front of ``direct_url``'s server."""

    direct_url: str
    socket_dir: Path
    version: str

    @property
    def url(self) -> str:
        """``direct_url`` through PgBouncer (its unix socket)."""
        direct = sa.make_url(self.direct_url)
        through = sa.URL.create(
            direct.drivername,
            username=direct.username,
            password=direct.password,
            database=direct.database,
            query={"host": str(self.socket_dir), "port": str(SOCKET_PORT)},
        )
        return through.render_as_string(hide_password=False)

    def clients(self) -> Counter[str]:
        """Client connections to our database open right now, per ``application_name``."""
        import psycopg

        database = sa.make_url(self.direct_url).database
        with psycopg.connect(
            host=str(self.socket_dir),
            port=SOCKET_PORT,
            dbname="pgbouncer",
            user="postgres",
            autocommit=True,
        ) as admin:
            cursor = admin.execute("SHOW CLIENTS")
            assert cursor.description is not None
            columns = [column.name for column in cursor.description]
            rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
        return Counter(row["application_name"] for row in rows if row["database"] == database)


@contextmanager
def running_pgbouncer(database_url: str) -> Iterator[Bouncer]:
    """PgBouncer in transaction pooling mode in front of ``database_url``'s server until the
    block ends, run as ``postgres`` when we are root (it refuses to run as root)."""
    binary = pgbouncer_binary()
    version = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, check=True
    ).stdout.split("\n")[0]
    server = sa.make_url(database_url)
    login = f"user={server.username or 'postgres'}"
    if server.password:
        login += f" password={server.password}"
    config_dir = Path(tempfile.mkdtemp(prefix="sqlqueue-pgbouncer-"))
    config = config_dir / "pgbouncer.ini"
    config.write_text(
        "[databases]\n"
        f"* = host={server.host or '127.0.0.1'} port={server.port or 5432} {login}\n"
        "[pgbouncer]\n"
        f"listen_port = {SOCKET_PORT}\n"  # no listen_addr: the unix socket only
        f"unix_socket_dir = {config_dir}\n"
        "auth_type = any\n"
        "pool_mode = transaction\n"
        "admin_users = postgres\n"
        "default_pool_size = 10\n"
        "max_client_conn = 200\n"
    )
    command = [binary]
    if os.geteuid() == 0:
        shutil.chown(config_dir, user="postgres")
        shutil.chown(config, user="postgres")
        command += ["-u", "postgres"]
    log_path = config_dir / "pgbouncer.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [*command, str(config)], stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    bouncer = Bouncer(direct_url=database_url, socket_dir=config_dir, version=version)

    def accepting() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"pgbouncer exited: {log_path.read_text(errors='replace')}")
        try:
            bouncer.clients()
        except Exception:
            return False
        return True

    try:
        wait_until(accepting, timeout=15, what="pgbouncer to accept connections")
        yield bouncer
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        shutil.rmtree(config_dir, ignore_errors=True)
