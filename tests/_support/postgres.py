"""A private PostgreSQL cluster for one test: ``initdb`` into a temporary directory, served on a
unix socket in that directory only (``listen_addresses = ''``: no TCP port to race for), and
deleted afterwards. For faults a test may not inflict on the shared server, such as a restart.

The binaries come from ``pg_config --bindir`` or the newest ``/usr/lib/postgresql/*/bin``.
Missing, the test is skipped, or fails with ``CI=true``. As root, the cluster runs as the
``postgres`` user (PostgreSQL refuses root), via ``runuser``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

__all__ = ["PrivateCluster", "postgres_binaries", "private_cluster"]

_IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def postgres_binaries() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or ``None``."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config is not None:
        done = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        if done.returncode == 0:
            candidates.append(Path(done.stdout.strip()))
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"),
        key=lambda path: int(path.parent.name) if path.parent.name.isdigit() else 0,
        reverse=True,
    )
    candidates += versions
    for directory in candidates:
        if all((directory / name).is_file() for name in ("initdb", "pg_ctl", "postgres")):
            return directory
    return None


@dataclass(frozen=True)
class PrivateCluster:
    """A running cluster of this test's own: its directory, URL and ``pg_ctl``."""

    directory: Path
    binaries: Path
    run_as: tuple[str, ...]

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def log(self) -> Path:
        return self.directory / "server.log"

    def url(self, database: str = "postgres") -> str:
        """A psycopg URL of ``database`` on the cluster's unix socket."""
        return f"postgresql+psycopg://postgres@/{database}?host={self.directory}"

    def pg_ctl(self, *args: str, timeout: float = 60) -> float:
        """Run ``pg_ctl ARGS`` on the cluster (waiting for it); return how long it took."""
        started = time.monotonic()
        done = subprocess.run(
            [*self.run_as, str(self.binaries / "pg_ctl"), "-D", str(self.data), "-w",
             "-t", str(int(timeout)), *args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            text=True, timeout=timeout + 10, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            server_log = self.log.read_text(errors="replace") if self.log.exists() else ""
            raise AssertionError(f"pg_ctl {' '.join(args)} failed: {done.stderr}\n{server_log}")
        return time.monotonic() - started

    def start(self) -> float:
        options = f"-k {self.directory} -c listen_addresses='' -c fsync=off -c max_connections=60"
        return self.pg_ctl("start", "-l", str(self.log), "-o", options)

    def restart(self) -> float:
        """A fast restart (``-m fast``): every connection is dropped, the server comes back."""
        return self.pg_ctl("restart", "-m", "fast", "-l", str(self.log))

    def stop(self) -> None:
        self.pg_ctl("stop", "-m", "immediate")


@contextmanager
def private_cluster(database: str = "sqlqueue") -> Iterator[tuple[PrivateCluster, str]]:
    """Start a private cluster with an empty ``database``; yield the cluster and that
    database's URL; stop it and delete its directory afterwards."""
    binaries = postgres_binaries()
    if binaries is None:
        message = "PostgreSQL's server binaries (initdb, pg_ctl) are not installed"
        if _IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    # Not pytest's tmp_path: the postgres user must reach the directory, and a socket path
    # must stay under ~100 bytes.
    directory = Path(tempfile.mkdtemp(prefix="sqlqueue-pg-"))
    run_as: tuple[str, ...] = ()
    if os.geteuid() == 0:
        shutil.chown(directory, user="postgres", group="postgres")
        run_as = ("runuser", "-u", "postgres", "--")
    cluster = PrivateCluster(directory=directory, binaries=binaries, run_as=run_as)
    try:
        subprocess.run(
            [*run_as, str(binaries / "initdb"), "-D", str(cluster.data), "-U", "postgres",
             "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"],
            capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        cluster.start()
        try:
            admin = sa.create_engine(
                cluster.url(), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool
            )
            with admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{database}"')
            admin.dispose()
            yield cluster, cluster.url(database)
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
