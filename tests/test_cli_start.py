"""What ``sqlqueue`` says as it starts, run as a user runs it (the installed script, its output
and exit code): ``--version`` without loading SQLAlchemy or a driver, a worker's one readable
start line, alembic quiet unless ``--verbose``, a warning for a ``--queues`` name no task uses,
and a help text for every option of ``sqlqueue worker``."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

import sqlqueue
from sqlqueue.cli import build_parser
from tests._support import run_cli, sqlqueue_command
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(180)

#: What ``--version`` and ``--help`` must not load: the database layer, its drivers, alembic.
HEAVY = {"sqlalchemy", "psycopg", "pymysql", "alembic", "croniter"}

#: An app as the tutorial writes one: it migrates as it is imported, then declares its tasks.
APP = """\
import os

import sqlalchemy as sa

import sqlqueue

engine = sa.create_engine(os.environ["SQLQUEUE_DATABASE_URL"])
sqlqueue.migrate(engine)
queue = sqlqueue.Queue(engine)


@queue.task("send_welcome", queue="mail")
def send_welcome(user_id: int) -> None:
    print("welcome", user_id)


@queue.task("build_report", queue="reports")
def build_report(day: str) -> None:
    print("report", day)
"""


def imported_by(*args: str) -> set[str]:
    """The top-level modules that the installed script imports for ``sqlqueue ARGS``, in a new
    interpreter (``-X importtime`` lists each on stderr)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", *sqlqueue_command(), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    names = [
        line.rpartition("|")[2].strip()
        for line in result.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    ]
    return {name.partition(".")[0] for name in names}


def test_version_and_help_load_no_database_library() -> None:
    """``sqlqueue --version`` took a second: it imported SQLAlchemy, the drivers and alembic
    before argparse printed the version."""
    loaded = imported_by("--version")
    assert "sqlqueue" in loaded  # the listing is read (a parser that found nothing would pass)
    assert loaded & HEAVY == set()
    assert imported_by("worker", "--help") & HEAVY == set()


def test_version_prints_the_version() -> None:
    result = run_cli("--version")
    assert (result.returncode, result.stdout) == (0, f"sqlqueue {sqlqueue.__version__}\n")


def start_worker(url: str, tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``sqlqueue worker app:queue --burst OPTIONS`` for the tutorial-style app above."""
    (tmp_path / "app.py").write_text(APP)
    result = run_cli("worker", "app:queue", "--burst", *options, url=url, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return result


def test_alembic_is_quiet_on_a_worker_start_unless_verbose(
    backend: Backend, tmp_path: Path
) -> None:
    """Every start printed alembic's INFO lines ("Context impl …", "Will assume …"), from the
    app's own ``sqlqueue.migrate()``: now only with ``--verbose``."""
    quiet = start_worker(backend.url, tmp_path)
    assert "alembic" not in quiet.stderr, quiet.stderr
    assert "serving queues" in quiet.stderr  # the worker's own log is still there
    verbose = start_worker(backend.url, tmp_path, "--verbose")
    assert " INFO alembic." in verbose.stderr, verbose.stderr


def start_line(result: subprocess.CompletedProcess[str]) -> str:
    [line] = [line for line in result.stderr.splitlines() if "serving queues" in line]
    return line.partition("serving queues ")[2]


def warnings_of(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stderr.splitlines() if " WARNING " in line]


def test_a_worker_start_line_names_its_queues_and_slots(tmp_path: Path) -> None:
    """It read ``serving queues {'mail, reports': 4} (slots: 4 in all; …)``."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    assert start_line(start_worker(url, tmp_path)) == (
        "default, mail and reports sharing 4 slots; lease 30.0 s"
    )
    assert start_line(start_worker(url, tmp_path, "--queues", "mail,reports")) == (
        "mail and reports sharing 4 slots; lease 30.0 s"
    )
    assert start_line(start_worker(url, tmp_path, "--queues", "mail=2,reports=1")) == (
        "mail with 2 slots, reports with 1 slot (3 slots in all); lease 30.0 s"
    )


@pytest.mark.parametrize("queues", ["mial,reports", "mial=2,reports=1"])
def test_a_queue_no_task_uses_is_warned_about(tmp_path: Path, queues: str) -> None:
    """``--queues mial`` (a typo of ``mail``) started in silence and served an empty queue."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    result = start_worker(url, tmp_path, "--queues", queues)
    [warning] = warnings_of(result)
    assert warning.endswith(
        "no registered task uses the queue 'mial' (its tasks' queues: mail, reports); it is "
        "served only for jobs enqueued with queue='mial'"
    ), warning
    assert warnings_of(start_worker(url, tmp_path, "--queues", "mail,reports")) == []


def _silent_arguments(parser: argparse.ArgumentParser, path: str) -> list[str]:
    """Every argument of ``parser`` and its subcommands, at any depth, without a help text."""
    silent = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, command in action.choices.items():
                silent += _silent_arguments(command, f"{path} {name}")
        elif not action.help:
            silent.append(f"{path}: {'/'.join(action.option_strings) or action.dest}")
    return silent


def test_every_worker_option_has_a_help_text() -> None:
    """``--concurrency``, ``--poll-interval`` and ``--shutdown-timeout`` had none, nor had
    34 arguments of the operators' commands (``jobs list --status``, ``pause --by``, …)."""
    for given in (False, True):  # `sqlqueue worker`, and the frameworks' worker commands
        silent = _silent_arguments(build_parser(given=given), "sqlqueue")
        assert silent == [], silent
    shown = run_cli("worker", "--help")
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())  # argparse wraps to the terminal's width
    for words in (
        "--concurrency CONCURRENCY how many jobs it runs at once",
        "--poll-interval SECONDS how often an idle worker looks for due jobs",
        "--shutdown-timeout SECONDS on SIGTERM/SIGINT, how long running jobs may take",
    ):
        assert words in text, shown.stdout
