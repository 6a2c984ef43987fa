"""The examples are real programs: run them as a user would and check what they leave behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "signup_demo.py"


def run_demo(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "SQLQUEUE_DATABASE_URL"}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, str(DEMO), *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_signup_demo_runs_as_is_on_the_embedded_sqlite_default(tmp_path):
    result = run_demo(cwd=tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks passed" in result.stdout
    match = re.search(r"^database: sqlite:///(.+)$", result.stdout, re.MULTILINE)
    assert match, result.stdout
    database = Path(match.group(1))
    assert not database.parent.exists(), "the temporary work directory is removed at exit"


def test_signup_demo_tells_its_story_and_leaves_this_database(backend, tmp_path):
    workdir = tmp_path / "work"

    result = run_demo("--database-url", backend.url, "--workdir", str(workdir), cwd=tmp_path)

    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "all checks passed" in out
    assert "UNEXPECTED" not in out
    assert "rows in sqlqueue_jobs: 3 before, 3 after" in out
    assert "users named bob: 0; Bob's jobs still in the queue: 0" in out
    assert "send_welcome_email) attempt 2/5 failed: TemporaryMailError: 421" in out
    assert "retrying in 1.0 s" in out
    assert "sync_crm_contact) is dead after attempt 3/3: ConnectionError" in out
    assert "already recorded as sent: not sending it again" in out
    assert "by support@example.test" in out

    engine = backend.engine
    meta = sa.MetaData()
    jobs = sa.Table("sqlqueue_jobs", meta, autoload_with=engine)
    users = sa.Table("demo_users", meta, autoload_with=engine)
    with engine.connect() as conn:
        (ada_id,) = conn.execute(sa.select(users.c.id)).scalars().all()
        rows = conn.execute(sa.select(jobs).order_by(jobs.c.id)).mappings().all()
        counts = {
            name: conn.scalar(sa.select(sa.func.count()).select_from(sa.table(name)))
            for name in ("demo_sent_emails", "demo_crm_contacts", "demo_analytics_events")
        }
    assert counts == {"demo_sent_emails": 1, "demo_crm_contacts": 1, "demo_analytics_events": 1}

    # Bob's rolled-back sign-up left nothing; Ada's double-submit added nothing.
    assert len(rows) == 4
    assert all(row["payload"]["user_id"] == ada_id for row in rows)
    by_type: dict[str, list[sa.RowMapping]] = {}
    for row in rows:
        by_type.setdefault(row["job_type"], []).append(row)

    (email,) = by_type["send_welcome_email"]
    assert (email["status"], email["attempts"]) == ("succeeded", 3)
    assert email["idempotency_key"] == f"welcome_email:user:{ada_id}"
    assert [entry["attempt"] for entry in email["errors"]] == [1, 2]
    assert all("421" in entry["error"] for entry in email["errors"])

    (event,) = by_type["track_signup"]
    assert (event["status"], event["attempts"], event["errors"]) == ("succeeded", 1, [])

    dead, requeued = by_type["sync_crm_contact"]
    assert (dead["status"], dead["attempts"], len(dead["errors"])) == ("dead", 3, 3)
    assert dead["last_error"].startswith("ConnectionError: ")
    assert dead["requeued_as"] == requeued["id"]
    assert (dead["requeued_by"], dead["requeue_reason"]) == (
        "support@example.test",
        "CRM is back up",
    )
    assert dead["idempotency_key"] is None, "the key moved to the live job"
    assert (requeued["status"], requeued["attempts"]) == ("succeeded", 1)
    assert requeued["requeued_from"] == dead["id"]
    assert requeued["idempotency_key"] == f"crm_sync:user:{ada_id}"

    (mail,) = (workdir / "outbox").glob("*.eml")
    assert f"Message-ID: <welcome_email.user.{ada_id}@signup-demo.example>" in mail.read_text()

    again = run_demo("--database-url", backend.url, "--workdir", str(workdir), cwd=tmp_path)
    assert again.returncode == 2
    assert "point --database-url at a new one" in again.stdout
