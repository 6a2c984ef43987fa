"""Email as a built-in job kind: ``pip install "sqlalchemy-sqlqueue[email]"`` (aiosmtplib).

A :class:`Mailer` registers one ordinary task on your Queue; ``mailer.send(conn, …)`` enqueues a
message in your transaction, and workers deliver it over SMTP::

    from sqlqueue.email import SMTP, Content, Mailer

    mailer = Mailer(queue, smtp=SMTP(host="smtp.example.com", port=587, username="app",
                                     password=os.environ["SMTP_PASSWORD"]),
                    sender="Example <noreply@example.com>")

    @mailer.template("welcome", version="3")
    def welcome(user_name: str) -> Content:
        return Content(subject="Welcome", text=f"Hello {user_name}")

    mailer.send(conn, to="ada@example.com", template="welcome",
                context={"user_name": "Ada"}, dedup_key="welcome:user:1")

Each message gets a Message-ID at enqueue (the same on every attempt), the job records the
template's name and version (or a hash of the content), and its result holds the server's
reply with the accepted and refused recipients. 4xx replies and network errors retry; 5xx
replies go to dead at once. Recipients answered with a 4xx while others were accepted are sent
the same message (same Message-ID) by a follow-up job, enqueued with the success. A ledger
written with the job's success keeps a retried job from sending a message that already went out.
"""

from __future__ import annotations

try:
    import aiosmtplib  # noqa: F401  (only to say what to install)
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        'sqlqueue.email needs aiosmtplib: pip install "sqlalchemy-sqlqueue[email]"'
    ) from error

from sqlqueue.email._config import SMTP, Content
from sqlqueue.email._errors import (
    EmailInputError,
    InvalidAddress,
    SMTPPermanentError,
    SMTPTemporaryError,
    TemplateChanged,
    UnknownTemplate,
    UnsafeHeader,
)
from sqlqueue.email._mailer import Mailer, TemplateChangePolicy

__all__ = [
    "SMTP",
    "Content",
    "EmailInputError",
    "InvalidAddress",
    "Mailer",
    "SMTPPermanentError",
    "SMTPTemporaryError",
    "TemplateChangePolicy",
    "TemplateChanged",
    "UnknownTemplate",
    "UnsafeHeader",
]
