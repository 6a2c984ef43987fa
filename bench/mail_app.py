"""The application ``python -m bench.mail`` runs its worker on: one Mailer sending to the local
SMTP sink on ``SQLQUEUE_BENCH_SMTP_PORT``, with one template.

The worker loads it with ``python -m sqlqueue worker bench.mail_app:queue``; the database comes
from ``SQLQUEUE_DATABASE_URL``.
"""

from __future__ import annotations

import os

import sqlqueue
from sqlqueue.email import SMTP, Content, Mailer

__all__ = ["mailer", "queue"]

_url = os.environ.get("SQLQUEUE_DATABASE_URL")
if not _url:
    raise SystemExit("bench.mail_app needs SQLQUEUE_DATABASE_URL (the benchmark sets it)")

queue = sqlqueue.Queue(_url)
mailer = Mailer(
    queue,
    smtp=SMTP(
        host="127.0.0.1",
        port=int(os.environ.get("SQLQUEUE_BENCH_SMTP_PORT", "8025")),
        starttls=False,
    ),
    sender="Bench <bench@example.com>",
)


@mailer.template("bench", version="1")
def bench_message(n: int) -> Content:
    """A small message with a text and an HTML part, like a typical notification."""
    return Content(
        subject=f"Message {n}",
        text=f"This is message {n}.\n" * 20,
        html=f"<p>This is message <b>{n}</b>.</p>" * 20,
    )
