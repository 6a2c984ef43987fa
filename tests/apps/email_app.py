"""A queue with a Mailer whose worker process, on its first attempt, dies by SIGKILL after the
SMTP server accepted the message and before the job's transaction commits: a real crash in
the one window the ledger cannot close.

The kill fires when the ledger's INSERT is about to run (the message is sent by then, and the
transaction carrying the job's success is open); ``EMAIL_CRASH_MARKER`` is a file that makes it
fire once.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import sqlqueue
from sqlqueue.email import SMTP, Content, Mailer
from tests.apps import UNOPENED_DATABASE

queue = sqlqueue.Queue(
    os.environ.get("SQLQUEUE_DATABASE_URL", UNOPENED_DATABASE),  # importable by the test itself
    lease_seconds=float(os.environ.get("EMAIL_LEASE_SECONDS", "1.5")),
)
mailer = Mailer(
    queue,
    smtp=SMTP(host="127.0.0.1", port=int(os.environ.get("EMAIL_SMTP_PORT", "25")), starttls=False),
    sender="Example <noreply@example.com>",
    backoff=[0],
)


@mailer.template("welcome", version="1")
def welcome(user_name: str) -> Content:
    return Content(subject=f"Welcome, {user_name}", text=f"Hello {user_name}.")


def _die_before_the_ledger_commits(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
    marker = Path(os.environ.get("EMAIL_CRASH_MARKER", os.devnull))
    if "INSERT INTO sqlqueue_email_sent" in statement and not marker.exists():
        marker.write_text("crashed once")
        os.kill(os.getpid(), signal.SIGKILL)


sa.event.listen(sa.Engine, "before_cursor_execute", _die_before_the_ledger_commits)
