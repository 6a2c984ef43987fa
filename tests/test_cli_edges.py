"""The sharp edges of the ``sqlqueue`` console script a new user meets in the first hour, each
run as they would run it: the installed ``sqlqueue`` script in a subprocess, its output and its
exit code (0 ok, 1 a problem found, 2 usage, 3 database unreachable or not migrated)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import SCHEMA_REVISION
from sqlqueue.dialects import dialect_for
from tests._support import drain, sqlqueue_command
from tests._support import run_cli as sqlqueue_cli
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(180)

UNREACHABLE_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:1/sqlqueue"


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("sqlqueue: error: "), result.stderr
    return lines[0]


def dead_jobs(backend: Backend, count: int) -> tuple[sqlqueue.Queue, list[int]]:
    queue = backend.queue()

    @queue.task("send_webhook", queue="webhooks", max_attempts=1)
    def send_webhook(endpoint: str) -> None:
        raise ConnectionError(f"503 from {endpoint}")

    with backend.engine.begin() as conn:
        ids = [send_webhook.enqueue(conn, endpoint=f"crm{n}.example.com") for n in range(count)]
    drain(queue)
    return queue, ids


def test_version() -> None:
    """The installed script in a new interpreter (``fresh``), as a user first runs it."""
    result = sqlqueue_cli("--version", fresh=True)
    assert (result.returncode, result.stdout.strip()) == (0, f"sqlqueue {sqlqueue.__version__}")


def test_output_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    engine = sa.create_engine(url)
    sqlqueue.migrate(engine)
    queue = sqlqueue.Queue(engine)
    with engine.begin() as conn:  # listings far larger than a pipe's buffer (64 KiB)
        queue.enqueue_many(
            conn,
            [
                sqlqueue.JobRequest(job_type=f"export.section_{n}", payload={}, external=True)
                for n in range(3000)
            ],
        )
    engine.dispose()
    environment = {**os.environ, "SQLQUEUE_DATABASE_URL": url, "SCRIPT": sqlqueue_command()[0]}
    for command in ("stats", "jobs list --limit 3000"):
        piped = subprocess.run(
            ["bash", "-c", f'"$SCRIPT" {command} | head -1; echo "status ${{PIPESTATUS[0]}}"'],
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        lines = piped.stdout.splitlines()
        assert lines[0].startswith(("queue", "id")), piped.stdout
        assert lines[1:] == ["status 0"], piped.stdout
        assert piped.stderr == "", piped.stderr


def test_a_url_naming_only_the_database_uses_sqlqueues_driver(backend: Backend) -> None:
    """``postgresql://`` gets psycopg 3, ``mysql://`` and ``mariadb://`` PyMySQL: no driver
    sqlqueue's extras do not install."""
    url = sa.make_url(backend.url)
    for name in dialect_for(backend.engine).names:
        bare = url.set(drivername=name).render_as_string(hide_password=False)
        migrated = sqlqueue_cli("migrate", "--database-url", bare)
        assert migrated.returncode == 0, migrated.stderr
        stats = sqlqueue_cli("stats", "--json", "--database-url", bare)
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)["by_status"]["queued"] == 0


@pytest.mark.parametrize(
    ("url", "blocked", "extra"),
    [
        ("mysql://root@127.0.0.1:1/test", "pymysql", "mysql"),
        ("mariadb://root@127.0.0.1:1/test", "pymysql", "mysql"),
        ("postgresql://postgres@127.0.0.1:1/test", "psycopg", "postgres"),
    ],
)
def test_a_missing_driver_names_the_extra_that_installs_it(
    url: str, blocked: str, extra: str, tmp_path: Path
) -> None:
    (tmp_path / f"{blocked}.py").write_text(
        f"raise ImportError(\"No module named '{blocked}'\")\n"
    )  # stands in for a virtualenv without the driver (a fresh interpreter: no driver imported)
    result = sqlqueue_cli(
        "stats", "--database-url", url, env={"PYTHONPATH": str(tmp_path)}, fresh=True
    )
    assert result.returncode == 2, result.stderr
    line = one_error_line(result)
    assert "the driver for" in line
    assert f'pip install "sqlalchemy-sqlqueue[{extra}]"' in line


@pytest.mark.parametrize(
    ("command", "kind"),
    [(["jobs", "show"], "job"), (["batch", "show"], "batch"), (["workflow", "show"], "workflow")],
)
def test_a_bad_id_is_named_for_what_the_command_shows(
    command: list[str], kind: str, tmp_path: Path
) -> None:
    """``workflow show abc`` once said "expected a job id": the id it wants is a workflow's."""
    url = f"sqlite:///{tmp_path / 'unused.db'}"  # a usage error never opens it
    word = sqlqueue_cli(*command, "abc", url=url)
    assert word.returncode == 2, word.stderr
    assert f"expected a {kind} id, got 'abc'" in word.stderr
    zero = sqlqueue_cli(*command, "0", url=url)
    assert zero.returncode == 2, zero.stderr
    assert f"a {kind} id is between 1 and " in zero.stderr


def test_a_worker_on_a_missing_sqlite_file_exits_3_and_creates_nothing(tmp_path: Path) -> None:
    app = f"sqlite:///{tmp_path / 'app.db'}"
    typo = tmp_path / "missing.db"
    result = sqlqueue_cli(
        "worker", "tests.apps.ops_app:queue", "--burst", "--database-url", f"sqlite:///{typo}",
        url=app,
    )  # fmt: skip
    assert result.returncode == 3, result.stderr
    assert f"there is no SQLite database at {typo}" in one_error_line(result)
    assert not typo.exists()


def test_migrate_says_in_one_line_what_it_did(backend: Backend, tmp_path: Path) -> None:
    again = sqlqueue_cli("migrate", "--database-url", backend.url)
    assert again.returncode == 0, again.stderr
    assert again.stdout == f"sqlqueue: already up to date at revision {SCHEMA_REVISION}\n"
    assert again.stderr == ""

    url = f"sqlite:///{tmp_path / 'old.db'}"
    sqlqueue.migrate(url, revision="0007")
    upgraded = sqlqueue_cli("migrate", "--database-url", url)
    assert upgraded.returncode == 0, upgraded.stderr
    assert (upgraded.stdout, upgraded.stderr) == (
        f"sqlqueue: migrated from 0007 to {SCHEMA_REVISION}\n",
        "",
    )

    fresh = f"sqlite:///{tmp_path / 'fresh.db'}"
    verbose = sqlqueue_cli("migrate", "--verbose", "--database-url", fresh)
    assert verbose.stdout == f"sqlqueue: migrated from an empty database to {SCHEMA_REVISION}\n"
    assert "Running upgrade 0008 -> 0009" in verbose.stderr  # alembic's own log


def test_web_on_a_taken_port_exits_2_in_one_line(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    sqlqueue.migrate(url)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = str(taken.getsockname()[1])
        result = sqlqueue_cli("web", "--port", port, url=url)
        assert result.returncode == 2, result.stderr
        line = one_error_line(result)
        assert f"cannot listen on 127.0.0.1:{port} (Address already in use)" in line
        assert "--port" in line
        unreachable = sqlqueue_cli("web", "--port", port, url=UNREACHABLE_POSTGRES)
        assert unreachable.returncode == 3, unreachable.stderr
        assert "cannot reach PostgreSQL" in one_error_line(unreachable)


def test_dead_requeue_takes_ids_and_says_what_became_of_each(backend: Backend) -> None:
    queue, (first, second, third) = dead_jobs(backend, 3)

    dry = sqlqueue_cli("dead", "requeue", str(first), "--dry-run", url=backend.url)
    assert (dry.returncode, dry.stdout) == (0, f"job {first}: would requeue it\n"), dry.stderr
    assert queue.stats().by_status["queued"] == 0  # a dry run changes nothing, needs no --by

    unsigned = sqlqueue_cli("dead", "requeue", str(first), url=backend.url)
    assert unsigned.returncode == 2
    assert "needs --by and --reason" in one_error_line(unsigned)

    done = sqlqueue_cli(
        "dead", "requeue", str(first), str(second), "--by", "alice", "--reason", "CRM is back",
        url=backend.url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    new_first = queue.get_job(first).requeued_as  # type: ignore[union-attr]
    new_second = queue.get_job(second).requeued_as  # type: ignore[union-attr]
    assert done.stdout.splitlines() == [
        f"job {first}: requeued as job {new_first}",
        f"job {second}: requeued as job {new_second}",
    ]

    again = sqlqueue_cli(
        "dead", "requeue", str(first), str(third), "--by", "alice", "--reason", "again",
        "--json", url=backend.url,
    )  # fmt: skip
    assert again.returncode == 1  # as the API raises for the one already requeued
    outcomes = json.loads(again.stdout)["jobs"]
    assert outcomes[0] == {
        "id": first,
        "error": f"job {first} was already requeued as job {new_first}",
    }
    assert outcomes[1]["requeued_as"] == queue.get_job(third).requeued_as  # type: ignore[union-attr]
    shown = sqlqueue_cli("dead", "requeue", str(first), "--dry-run", url=backend.url)
    assert (
        shown.stdout == f"job {first}: error: job {first} was already requeued as job {new_first}\n"
    )
    assert shown.returncode == 1

    discarded = sqlqueue_cli(
        "dead", "discard", str(new_first), "--by", "bob", "--reason", "x", url=backend.url
    )
    assert discarded.returncode == 1  # a queued job is not dead
    assert f"job {new_first} is queued; only dead jobs can be discarded" in discarded.stdout


def test_pause_of_a_queue_that_never_had_a_job_asks_for_force(backend: Backend) -> None:
    queue, _ = dead_jobs(backend, 1)
    typo = sqlqueue_cli(
        "pause", "webhook", "--by", "ops", "--reason", "maintenance", url=backend.url
    )
    assert typo.returncode == 2
    assert "queue 'webhook' has never had a job (a typo?): pass --force" in one_error_line(typo)
    assert queue.paused_queues() == []

    forced = sqlqueue_cli(
        "pause", "webhook", "--force", "--by", "ops", "--reason", "before launch", "--json",
        url=backend.url,
    )  # fmt: skip
    assert forced.returncode == 0, forced.stderr
    assert json.loads(forced.stdout) == {
        "queue": "webhook", "paused": True, "by": "ops", "reason": "before launch",
    }  # fmt: skip
    known = sqlqueue_cli("pause", "webhooks", "--by", "ops", "--reason", "r", url=backend.url)
    assert known.returncode == 0, known.stderr
    assert queue.paused_queues() == ["webhook", "webhooks"]

    resumed = sqlqueue_cli("resume", "webhook", "--json", url=backend.url)
    assert json.loads(resumed.stdout) == {"queue": "webhook", "paused": False, "was_paused": True}
    twice = sqlqueue_cli("resume", "webhook", "--json", url=backend.url)
    assert json.loads(twice.stdout)["was_paused"] is False


@pytest.mark.parametrize(
    ("older_than", "said"),
    [
        ("0", "deleted 0 succeeded or cancelled job(s) however recently they finished"),
        ("45", "deleted 0 succeeded or cancelled job(s) that finished over 45 seconds ago"),
        ("90m", "deleted 0 succeeded or cancelled job(s) that finished over 1 hour 30 minutes ago"),
        ("7d", "deleted 0 succeeded or cancelled job(s) that finished over 7 days ago"),
        ("2w", "deleted 0 succeeded or cancelled job(s) that finished over 14 days ago"),
    ],
)
def test_prune_says_its_duration_as_a_person_would(
    older_than: str, said: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    sqlqueue.migrate(url)
    result = sqlqueue_cli("prune", "--older-than", older_than, url=url)
    assert (result.returncode, result.stdout, result.stderr) == (0, said + "\n", "")
