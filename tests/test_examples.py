"""The examples are real programs: run them as a user would and check what they leave behind."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import sqlalchemy as sa

from sqlqueue import _schema as schema
from sqlqueue.testing import DrainResult, assert_enqueued, drain, enqueued_jobs

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "examples" / "signup_demo.py"
WEBHOOK_TASK = "sqlqueue.webhooks.deliver"


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
    took = re.search(r"^\(took (\d+\.\d) s\)$", result.stdout, re.MULTILINE)
    assert took, result.stdout  # says how long it took (a figure; the run's deadline is 120 s)


def test_signup_demo_tells_its_story_and_leaves_this_database(backend, tmp_path):
    result = run_demo("--database-url", backend.url, cwd=tmp_path)

    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "all checks passed" in out
    assert "UNEXPECTED" not in out
    assert "rows in sqlqueue_jobs: 3 before, 3 after" in out
    assert "users named bob: 0; Bob's jobs still in the queue: 0" in out
    assert "(email) attempt 1/3 failed: SMTPTemporaryError: SMTP server 127.0.0.1:" in out
    assert f"({WEBHOOK_TASK}) attempt 2/3 failed: DeliveryFailed: 503 Service Unavailable" in out
    assert f"({WEBHOOK_TASK}) is dead after attempt 3/3" in out
    assert (
        f"$ sqlqueue dead requeue --type {WEBHOOK_TASK} --by support@example.com "
        "--reason 'CRM is back'" in out
    )
    assert "the CRM answered: [503, 503, 503, 200]" in out
    assert "signature verified with sqlqueue.webhooks.verify()" in out
    assert "the CRM answered 400 (no matching signature" in out

    engine = backend.engine
    meta = sa.MetaData()
    # sqlqueue's own declarations, not reflected ones: MariaDB reports its JSON columns as
    # LONGTEXT, which would read the documents back as text.
    jobs, ledger, endpoints = schema.jobs, schema.email_sent, schema.webhook_endpoints
    users = sa.Table("demo_users", meta, autoload_with=engine)
    with engine.connect() as conn:
        (ada_id,) = conn.execute(sa.select(users.c.id)).scalars().all()
        rows = conn.execute(sa.select(jobs).order_by(jobs.c.id)).mappings().all()
        sent = conn.execute(sa.select(ledger)).mappings().all()
        (crm,) = conn.execute(sa.select(endpoints)).mappings().all()
        events = conn.scalar(
            sa.select(sa.func.count()).select_from(sa.table("demo_analytics_events"))
        )
    assert events == 1

    # Bob's rolled-back sign-up left nothing; Ada's double-submit added nothing; the requeue
    # added one job.
    assert len(rows) == 4
    by_type: dict[str, list[sa.RowMapping]] = {}
    for row in rows:
        by_type.setdefault(row["job_type"], []).append(row)
    assert sorted(by_type) == ["email", WEBHOOK_TASK, "track_signup"]

    (email,) = by_type["email"]
    assert (email["status"], email["attempts"]) == ("succeeded", 2)
    assert email["idempotency_key"] == f"welcome:user:{ada_id}"
    assert [entry["attempt"] for entry in email["errors"]] == [1]
    assert "421 4.7.0" in email["errors"][0]["error"]
    message_id = email["payload"]["message_id"]
    assert email["payload"]["template"] == {"name": "welcome", "version": "1"}
    assert email["result"]["message_id"] == message_id
    assert email["result"]["reply"].startswith("250 ")
    assert [(row["message_id"], row["key"]) for row in sent] == [
        (message_id, f"welcome:user:{ada_id}")
    ]
    # What the aiosmtpd server received, as the demo printed it.
    assert f"Message-ID: {message_id}" in out
    assert "Subject:    Welcome, Ada!" in out

    (event,) = by_type["track_signup"]
    assert (event["status"], event["attempts"], event["errors"]) == ("succeeded", 1, [])
    assert event["payload"] == {"user_id": ada_id}

    dead, requeued = by_type[WEBHOOK_TASK]
    assert (dead["status"], dead["attempts"]) == ("dead", 3)
    assert [entry["details"]["status"] for entry in dead["errors"]] == [503, 503, 503]
    assert dead["last_error"].startswith("DeliveryFailed: 503 Service Unavailable from 127.0.0.1")
    assert dead["requeued_as"] == requeued["id"]
    assert (dead["requeued_by"], dead["requeue_reason"]) == ("support@example.com", "CRM is back")
    assert dead["idempotency_key"] is None, "the key moved to the live job"
    assert f"requeued 1 dead job(s) as new job(s): {requeued['id']}" in out
    assert (requeued["status"], requeued["attempts"]) == ("succeeded", 1)
    assert requeued["requeued_from"] == dead["id"]
    assert requeued["idempotency_key"] == f"crm:user:{ada_id}:created"
    assert requeued["payload"] == dead["payload"], "the same message, under the same webhook-id"
    assert requeued["payload"]["endpoint"] == "crm"
    assert requeued["result"]["status"] == 200
    assert f"webhook-id of all 4 requests: {dead['payload']['message_id']}" in out
    assert (crm["name"], crm["enabled"]) == ("crm", True)
    assert crm["url"].startswith("http://127.0.0.1:")

    again = run_demo("--database-url", backend.url, cwd=tmp_path)
    assert again.returncode == 2
    assert "point --database-url at a new one" in again.stdout


def load_demo() -> ModuleType:
    """The demo as a module, for a test that uses its app the way the app's own tests would."""
    spec = importlib.util.spec_from_file_location("signup_demo", DEMO)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


def test_the_demos_sign_up_tested_as_an_app_tests_it(backend):
    """The demo app under sqlqueue.testing: what a sign-up enqueues, then its jobs drained in
    this process against the demo's own mail server and CRM."""
    demo = load_demo()
    mail = demo.MailServer(busy=1)
    with demo.running_mail_server(mail) as smtp_port, demo.Crm() as crm:
        app = demo.build_app(backend.engine, smtp_port)
        demo.app_metadata.create_all(backend.engine)
        with backend.engine.begin() as conn:
            crm.secret = app.hooks.add_endpoint(conn, name="crm", url=crm.url).secret
        for _ in range(2):  # the second is a double-submit
            with backend.engine.begin() as conn:
                ada = demo.sign_up(app, conn, email="ada@example.com", name="Ada")

        queue = app.queue
        assert_enqueued(
            queue,
            "email",
            {
                "to": ["Ada <ada@example.com>"],
                "template": {"name": "welcome"},
                "context": {"name": "Ada"},
            },
            count=1,
        )
        assert_enqueued(
            queue, WEBHOOK_TASK, {"endpoint": "crm", "event_type": "user.created"}, count=1
        )
        assert_enqueued(queue, "track_signup", {"user_id": ada.user_id}, count=1)
        assert len(enqueued_jobs(queue)) == 3

        # The mail server is busy once, the CRM is down: the email retries and arrives, the
        # delivery fails three times and is dead.
        assert drain(queue, retry_now=True) == DrainResult(succeeded=2, failed=3, dead=1)
        (message,) = mail.received
        assert message["Subject"] == "Welcome, Ada!"
        assert [request.status for request in crm.requests] == [503, 503, 503]

        crm.up = True
        queue.requeue_where(job_type=WEBHOOK_TASK, by="support@example.com", reason="CRM is back")
        assert drain(queue) == DrainResult(succeeded=1)
        assert crm.contacts == {ada.user_id: "ada@example.com"}


@pytest.mark.parametrize(
    "command",
    [
        ["examples/fastapi_app.py"],
        ["examples/flask_app.py"],
        ["examples/django_bakery/manage.py", "demo"],
    ],
    ids=["fastapi", "flask", "django"],
)
def test_each_framework_example_runs_as_is_with_one_command(command, tmp_path):
    """Each framework's example, started by the one command its docstring gives, on its own
    SQLite file: the committed signup's job ran, the rolled-back one left nothing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SQLQUEUE_", "DJANGO_"))}
    env.pop("DATABASE_URL", None)
    env["TMPDIR"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "'succeeded': 1" in done.stdout
    assert "'queued': 0" in done.stdout
    assert ", True)]" in done.stdout  # one user or order, and its job did its work


def test_the_workflow_order_example_runs_as_is_on_the_embedded_sqlite_default(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k != "SQLQUEUE_DATABASE_URL"}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "workflow_order.py")],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks passed" in result.stdout
    assert "UNEXPECTED" not in result.stdout
    assert "requeued 1 dead job(s)" in result.stdout
