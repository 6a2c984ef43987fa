"""A database URL sqlqueue cannot use is refused in one line that says what to do: a driver
that is not installed names what to install (sqlqueue's extra, and the URL form that uses its
driver), a database sqlqueue has no dialect for names the ones it supports, and a URL that
cannot work says what to change (a MariaDB/MySQL server with no database named, a SQLite file in
a directory that does not exist). Each runs the installed ``sqlqueue`` script as a user does."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa

import sqlqueue
from tests._support import run_cli


def _error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single ``sqlqueue: error:`` line of a usage error (exit 2), no traceback."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("sqlqueue: error: ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        # Drivers SQLAlchemy knows but sqlqueue does not install (none is in the test env).
        (
            "mysql+mysqldb://root@127.0.0.1:1/test",
            'pip install "sqlalchemy-sqlqueue[mysql]" and use mysql+pymysql://…',
        ),
        (
            "postgresql+pg8000://postgres@127.0.0.1:1/test",
            'pip install "sqlalchemy-sqlqueue[postgres]" and use postgresql+psycopg://…',
        ),
        # A database sqlqueue has no dialect for: only its own driver can help.
        ("mssql+pyodbc://sa@127.0.0.1:1/test", "install the driver its URL names"),
    ],
)
def test_a_driver_that_is_not_installed_says_what_to_install(url: str, hint: str) -> None:
    line = _error_line(run_cli("stats", "--database-url", url))
    assert "is not installed" in line
    assert line.endswith(f": {hint}")


def test_a_database_sqlqueue_does_not_support_names_the_supported_ones(tmp_path: Path) -> None:
    # A stand-in for an installed pyodbc: enough of it for SQLAlchemy to build the engine. Put
    # first by PYTHONPATH, which only a fresh interpreter takes (not the fork server).
    (tmp_path / "pyodbc.py").write_text(
        'paramstyle = "qmark"\nversion = "5.1.0"\n\n\nclass Cursor:\n    def nextset(self): ...\n'
    )
    result = run_cli(
        "stats", "--database-url", "mssql+pyodbc://sa@127.0.0.1:1/test",
        env={"PYTHONPATH": str(tmp_path), "PYTHONWARNINGS": "ignore"}, fresh=True,
    )  # fmt: skip
    assert _error_line(result) == (
        "sqlqueue: error: --database-url: sqlqueue does not support the 'mssql' database yet "
        "(supported: mariadb, mysql, postgresql, sqlite)"
    )


@pytest.mark.parametrize("command", ["migrate", "stats"])
@pytest.mark.parametrize("slash", ["/", ""])
def test_a_mysql_url_that_names_no_database_says_to_add_one(
    mysql_url: str, command: str, slash: str
) -> None:
    """``mysql+pymysql://root@127.0.0.1:3306/`` reached the server, which let it in, and then
    ended in a bare ``AssertionError`` inside SQLAlchemy."""
    server = sa.make_url(mysql_url).set(database="")  # the test server, no database named
    url = server.render_as_string(hide_password=False).rstrip("/") + slash
    line = _error_line(run_cli(command, "--database-url", url))
    example = server.set(database="jobs").render_as_string(hide_password=True)
    assert line == (
        f"sqlqueue: error: --database-url: {url!r} names no database: add one, as in "
        f"{example} (CREATE DATABASE jobs first)"
    )


@pytest.mark.parametrize("command", ["migrate", "stats"])
def test_a_sqlite_file_in_a_missing_directory_names_the_directory(
    tmp_path: Path, command: str
) -> None:
    """``stats`` said to run ``sqlqueue migrate``, and ``migrate`` then failed ("unable to
    open database file"): the directory is what is missing, and neither creates it."""
    directory = tmp_path / "data"
    line = _error_line(run_cli(command, "--database-url", f"sqlite:///{directory}/jobs.db"))
    assert line == (
        f"sqlqueue: error: --database-url: 'sqlite:///{directory}/jobs.db' is a file in "
        f"{str(directory)!r}, which does not exist: create it, or fix the path"
    )
    assert not directory.exists()


def test_a_postgres_url_as_hosting_providers_hand_it_out_is_read_as_postgresql(
    postgres_url: str,
) -> None:
    """``postgres://…``, the form hosting providers hand out, got "Can't load plugin:
    sqlalchemy.dialects:postgres" (SQLAlchemy dropped the name): it is read as
    ``postgresql+psycopg://…``."""
    url = sa.make_url(postgres_url).set(drivername="postgres")
    assert url.render_as_string(hide_password=False).startswith("postgres://")
    for command in (["migrate"], ["stats", "--json"]):
        result = run_cli(*command, "--database-url", url.render_as_string(hide_password=False))
        assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("entry", ["migrate", "Queue"])
def test_the_python_api_refuses_a_mysql_url_that_names_no_database(
    mysql_url: str, entry: str
) -> None:
    """``sqlqueue.migrate(url)`` ended in a bare ``AssertionError`` inside SQLAlchemy, and a
    ``Queue`` on the URL failed at its first enqueue: both now refuse it when given it, with
    the CLI's sentence, the password hidden."""
    server = sa.make_url(mysql_url).set(database="", password="s3cret")
    url = server.render_as_string(hide_password=False)
    call = sqlqueue.migrate if entry == "migrate" else sqlqueue.Queue
    with pytest.raises(sqlqueue.ConfigurationError) as raised:
        call(url)
    shown = server.render_as_string(hide_password=True)
    example = server.set(database="jobs").render_as_string(hide_password=True)
    assert str(raised.value) == (
        f"database URL {shown!r} names no database: add one, as in {example} "
        "(CREATE DATABASE jobs first)"
    )
    assert "s3cret" not in str(raised.value)


def test_migrate_refuses_a_sqlite_file_in_a_missing_directory(tmp_path: Path) -> None:
    """The same check as the CLI's, before any file is opened: nothing is created. A
    ``Queue`` takes such a URL (its worker waits for the directory to appear:
    test_bad_input.py)."""
    directory = tmp_path / "data"
    with pytest.raises(sqlqueue.ConfigurationError, match="which does not exist: create it"):
        sqlqueue.migrate(f"sqlite:///{directory}/jobs.db")
    assert not directory.exists()
