"""A database URL sqlqueue cannot use is refused in one line that says what to do: a driver
that is not installed names what to install (sqlqueue's extra, and the URL form that uses its
driver), and a database sqlqueue has no dialect for names the ones it supports. Each runs the
installed ``sqlqueue`` script as a user does."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

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
            'pip install "sqlqueue[mysql]" and use mysql+pymysql://…',
        ),
        (
            "postgresql+pg8000://postgres@127.0.0.1:1/test",
            'pip install "sqlqueue[postgres]" and use postgresql+psycopg://…',
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
    # A stand-in for an installed pyodbc: enough of it for SQLAlchemy to build the engine.
    (tmp_path / "pyodbc.py").write_text(
        'paramstyle = "qmark"\nversion = "5.1.0"\n\n\nclass Cursor:\n    def nextset(self): ...\n'
    )
    result = run_cli(
        "stats", "--database-url", "mssql+pyodbc://sa@127.0.0.1:1/test",
        env={"PYTHONPATH": str(tmp_path), "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    assert _error_line(result) == (
        "sqlqueue: error: --database-url: sqlqueue does not support the 'mssql' database yet "
        "(supported: mariadb, mysql, postgresql, sqlite)"
    )
