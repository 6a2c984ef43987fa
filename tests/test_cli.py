"""The ``sqlqueue`` command as a user runs it: a subprocess, its output and its exit code.

Every command shares the exit codes (0 ok, 1 a problem found, 2 usage, 3 database unreachable
or not migrated) and prints errors as one line, never a traceback.
"""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue.testing import age_jobs
from tests._support import drain
from tests._support import run_cli as cli
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(180)

UNREACHABLE_POSTGRES = "postgresql+psycopg://postgres@127.0.0.1:1/sqlqueue"


def failing_queue(backend: Backend) -> sqlqueue.Queue:
    queue = backend.queue()

    @queue.task("send_webhook", queue="webhooks", max_attempts=1)
    def send_webhook(endpoint: str) -> None:
        raise ConnectionError(f"503 Service Unavailable from {endpoint}")

    @queue.task("send_email", queue="mail")
    def send_email(user_id: int) -> None:
        return None

    with backend.engine.begin() as conn:
        for _ in range(3):
            send_webhook.enqueue(conn, endpoint="crm.example.com")
        send_webhook.enqueue(conn, endpoint="billing.example.com")
        for user_id in range(4):
            send_email.enqueue(conn, user_id=user_id)
    drain(queue)
    return queue


# -- what an operator does, on both backends ----------------------------------------------------


def test_stats_prints_a_table_and_the_documented_json(backend: Backend) -> None:
    failing_queue(backend)

    human = cli("stats", url=backend.url)
    assert human.returncode == 0, human.stderr
    assert "webhooks" in human.stdout
    assert "send_email" in human.stdout
    assert "ConnectionError: 503 Service Unavailable from crm.example.com" in human.stdout

    machine = cli("stats", "--json", url=backend.url)
    assert machine.returncode == 0, machine.stderr
    stats = json.loads(machine.stdout)
    assert stats["by_status"] == {
        "queued": 0, "running": 0, "succeeded": 4, "failed": 0,
        "dead": 4, "cancelled": 0, "waiting": 0,
    }  # fmt: skip
    assert stats["queues"]["webhooks"]["by_status"]["dead"] == 4
    assert stats["queues"]["webhooks"]["oldest_queued_age_seconds"] is None
    assert stats["queues"]["mail"]["paused"] is False
    assert stats["job_types"]["send_email"]["succeeded"] == 4
    assert (stats["failed_last_hour"], stats["dead_last_hour"]) == (0, 4)
    assert stats["top_errors"][0] == {
        "error": "ConnectionError: 503 Service Unavailable from crm.example.com",
        "count": 3,
    }


def test_health_exits_1_with_an_alarm_and_0_when_healthy(backend: Backend) -> None:
    failing_queue(backend)

    # Nothing is left due, so neither queued_age nor no_workers (no worker runs) can fire.
    sick = cli("health", "--max-dead-last-hour", "3", "--json", url=backend.url)
    assert (sick.returncode, sick.stderr) == (1, ""), sick.stdout
    assert [alarm["name"] for alarm in json.loads(sick.stdout)["alarms"]] == ["dead_jobs"]

    text = cli("health", "--max-dead-last-hour", "3", url=backend.url)
    assert (text.returncode, text.stderr) == (1, ""), text.stdout
    assert text.stdout.startswith("ALARM dead_jobs: 4 jobs died in the last hour"), text.stdout

    fine = cli("health", "--max-dead-last-hour", "4", "--max-queued-age", "10m", url=backend.url)
    assert (fine.returncode, fine.stdout.strip(), fine.stderr) == (0, "healthy: no alarm", "")


def test_the_dead_letter_routine_list_dry_run_requeue_discard(backend: Backend) -> None:
    queue = failing_queue(backend)

    listed = cli("dead", "list", "--json", url=backend.url)
    assert len(json.loads(listed.stdout)) == 4

    refused = cli("dead", "requeue", "--by", "alice", "--reason", "CRM is back", url=backend.url)
    assert refused.returncode == 2
    assert "give job ids or a filter" in refused.stderr
    assert "--all" in refused.stderr

    dry = cli(
        "dead", "requeue", "--error-contains", "crm.example", "--by", "alice",
        "--reason", "CRM is back", "--dry-run", "--json", url=backend.url,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert len(json.loads(dry.stdout)["would_requeue"]) == 3
    assert queue.stats().by_status["queued"] == 0  # a dry run changes nothing

    done = cli(
        "dead", "requeue", "--error-contains", "crm.example", "--by", "alice",
        "--reason", "CRM is back", url=backend.url,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("requeued 3 dead job(s) as new job(s): ")
    assert queue.stats().by_status["queued"] == 3

    discarded = cli(
        "dead", "discard", "--type", "send_webhook", "--by", "bob",
        "--reason", "billing handled by hand", "--json", url=backend.url,
    )  # fmt: skip
    [discarded_id] = json.loads(discarded.stdout)["discarded"]
    shown = cli("jobs", "show", str(discarded_id), url=backend.url)
    assert "discarded:" in shown.stdout
    assert "by bob: billing handled by hand" in shown.stdout

    unhandled = cli("dead", "list", "--unhandled", "--json", url=backend.url)
    assert json.loads(unhandled.stdout) == []


def test_jobs_list_show_cancel_prune_pause_resume(backend: Backend) -> None:
    queue = failing_queue(backend)
    with backend.engine.begin() as conn:
        waiting = queue.enqueue(conn, "send_email", {"user_id": 9})

    listed = cli("jobs", "list", "--status", "queued", "--json", url=backend.url)
    assert [job["id"] for job in json.loads(listed.stdout)] == [waiting]
    paged = cli("jobs", "list", "--limit", "2", url=backend.url)
    assert "(more: --before-id" in paged.stdout

    shown = cli("jobs", "show", str(waiting), "--json", url=backend.url)
    assert json.loads(shown.stdout)["payload"] == {"user_id": 9}
    missing = cli("jobs", "show", "999999", url=backend.url)
    assert (missing.returncode, missing.stderr.strip()) == (
        1,
        "sqlqueue: error: there is no job 999999",
    )

    paused = cli("pause", "mail", "--by", "ops", "--reason", "smtp migration", url=backend.url)
    assert paused.returncode == 0, paused.stderr
    assert queue.paused_queues() == ["mail"]
    assert cli("resume", "mail", url=backend.url).stdout.strip() == "queue 'mail' resumed"

    cancelled = cli("cancel", str(waiting), url=backend.url)
    assert cancelled.stdout.strip() == f"job {waiting}: cancelled"
    assert cli("cancel", url=backend.url).returncode == 2

    age_jobs(queue, by=timedelta(days=30))  # everything finished long ago
    pruned = cli("prune", "--older-than", "7d", "--json", url=backend.url)
    assert json.loads(pruned.stdout)["deleted"] == 5  # 4 succeeded + 1 cancelled
    bad = cli("prune", "--older-than", "a week", url=backend.url)
    assert bad.returncode == 2
    assert "expected a duration" in bad.stderr


# -- the same exit codes for every command --------------------------------------------------

COMMANDS = {
    "stats": ["stats"],
    "health": ["health"],
    "workers": ["workers"],
    "jobs list": ["jobs", "list"],
    "jobs show": ["jobs", "show", "1"],
    "batch show": ["batch", "show", "1"],
    "dead list": ["dead", "list"],
    "dead requeue": ["dead", "requeue", "--all", "--by", "a", "--reason", "b"],
    "dead discard": ["dead", "discard", "--all", "--by", "a", "--reason", "b"],
    "cancel": ["cancel", "1"],
    "prune": ["prune", "--older-than", "7d"],
    "pause": ["pause", "mail", "--by", "a", "--reason", "b"],
    "resume": ["resume", "mail"],
    "migrate": ["migrate"],
    "worker": ["worker", "tests.apps.ops_app:queue", "--burst"],
}


def _command(name: str, url: str) -> list[str]:
    """The command with ``--database-url url`` (for ``worker``: serve that database instead of
    the one its app was built with)."""
    return [*COMMANDS[name], "--database-url", url]


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.startswith("sqlqueue: error:")]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_bad_url_is_a_usage_error(name: str, tmp_path: Path) -> None:
    result = cli(*_command(name, "garbage://x"), url=f"sqlite:///{tmp_path / 'app.db'}")

    assert result.returncode == 2, result.stderr
    assert "cannot use 'garbage://x'" in _one_line(result)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_an_unreachable_database_exits_3(name: str, tmp_path: Path) -> None:
    result = cli(*_command(name, UNREACHABLE_POSTGRES), url=f"sqlite:///{tmp_path / 'app.db'}")

    assert result.returncode == 3, result.stderr
    assert "cannot reach PostgreSQL" in _one_line(result)


@pytest.mark.parametrize("name", sorted(set(COMMANDS) - {"migrate"}))
def test_a_database_without_the_schema_exits_3_saying_run_migrate(
    name: str, tmp_path: Path
) -> None:
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    sa.create_engine(empty).connect().close()  # the file exists, with no tables

    result = cli(*_command(name, empty), url=empty)

    assert result.returncode == 3, result.stderr
    assert "sqlqueue migrate" in _one_line(result)


def test_a_missing_sqlite_file_is_not_created_by_reading_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'typo.db'}"

    result = cli("stats", url=url)

    assert result.returncode == 3
    assert "there is no SQLite database" in _one_line(result)
    assert not (tmp_path / "typo.db").exists()


def test_an_older_schema_is_named_with_the_revision_it_needs(backend: Backend) -> None:
    with backend.engine.begin() as conn:
        conn.execute(sa.text("UPDATE sqlqueue_alembic_version SET version_num = '0004'"))

    result = cli("stats", url=backend.url)

    assert result.returncode == 3
    assert "is at revision 0004" in _one_line(result)
    assert "run `sqlqueue migrate`" in result.stderr


def test_review_findings_each_command_refuses_or_reports_cleanly(backend: Backend) -> None:
    queue = failing_queue(backend)
    with backend.engine.begin() as conn:
        waiting = queue.enqueue(conn, "send_email", {"user_id": 9})

    # An empty filter ("$VAR" unset) is no filter: refused like none at all, nothing requeued.
    empty = cli(
        "dead", "requeue", "--error-contains", "", "--by", "a", "--reason", "b", url=backend.url
    )
    assert empty.returncode == 2
    assert queue.stats().by_status["queued"] == 1

    # A dry run with --limit lists the jobs the action takes: the oldest.
    dry = cli(
        "dead", "requeue", "--all", "--limit", "2", "--by", "a", "--reason", "b",
        "--dry-run", "--json", url=backend.url,
    )  # fmt: skip
    would = json.loads(dry.stdout)["would_requeue"]
    done = cli(
        "dead", "requeue", "--all", "--limit", "2", "--by", "a", "--reason", "b", "--json",
        url=backend.url,
    )  # fmt: skip
    requeued = json.loads(done.stdout)["requeued"]
    assert [queue.get_job(new).requeued_from for new in requeued] == would  # type: ignore[union-attr]

    # cancel of several ids: each one is tried; exit 1 when one could not be cancelled.
    mixed = cli("cancel", str(waiting), "999999", url=backend.url)
    assert mixed.returncode == 1
    assert f"job {waiting}: cancelled" in mixed.stdout
    assert "job 999999: error: there is no job 999999" in mixed.stdout

    # Out-of-range input is a usage error, not a traceback or "database unreachable".
    for args in (
        ("jobs", "show", "99999999999999999999"),
        ("jobs", "list", "--since", "1000000d"),
        ("prune", "--older-than", "999999999d"),
        ("pause", "q" * 101, "--by", "a", "--reason", "b"),
    ):
        result = cli(*args, url=backend.url)
        assert result.returncode == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_a_password_in_the_url_is_never_printed(tmp_path: Path) -> None:
    for url in ("garbage://ops:hunter2@db.example/app", "postgresql+psycopg2://ops:hunter2@h/db"):
        result = cli("stats", url=url)
        assert result.returncode == 2
        assert "hunter2" not in result.stderr
        assert "ops:***@" in result.stderr
