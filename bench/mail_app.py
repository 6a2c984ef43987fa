"""The application ``python -m bench.mail`` runs its worker on: one Mailer sending to the local
SMTP sink on ``SQLQUEUE_BENCH_SMTP_PORT``, with one template (see :func:`bench.mail.make_mailer`).

The worker loads it with ``python -m sqlqueue worker bench.mail_app:queue``; the database comes
from ``SQLQUEUE_DATABASE_URL``.
"""

from __future__ import annotations

import os

from bench.mail import make_mailer

__all__ = ["mailer", "queue"]

_url = os.environ.get("SQLQUEUE_DATABASE_URL")
_port = os.environ.get("SQLQUEUE_BENCH_SMTP_PORT")
if not _url or not _port:
    raise SystemExit(
        "bench.mail_app needs SQLQUEUE_DATABASE_URL and SQLQUEUE_BENCH_SMTP_PORT "
        "(python -m bench.mail sets them)"
    )

queue, mailer = make_mailer(
    _url, int(_port), pool_size=int(os.environ.get("SQLQUEUE_BENCH_SMTP_POOL", "0"))
)
