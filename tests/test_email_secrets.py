"""``Mailer(secret_fields=…)``: a reset token in a template's context never rests in clear, on
every backend, and the email still carries it.

The token is a random canary: it is looked for in every column of every job row and of the
ledger, as text, after the message went out (with a follow-up job for a recipient the server
answered 4xx, whose row holds the same context), and in the messages the real SMTP server
(aiosmtpd) received.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from cryptography.fernet import Fernet

import sqlqueue
from sqlqueue._schema import email_sent, jobs
from sqlqueue._secrets import MARKER
from sqlqueue.email import SMTP, Content, Mailer
from tests._support import drain
from tests.conftest import Backend
from tests.smtp_server import SMTPServer
from tests.test_email import SENDER, job_of
from tests.test_email import queues as queues

pytestmark = pytest.mark.timeout(90)

KEY = Fernet.generate_key().decode()


@pytest.fixture
def server() -> Iterator[tuple[SMTPServer, int]]:
    smtp = SMTPServer()
    with smtp.running() as port:
        yield smtp, port


def reset_mailer(
    backend: Backend, queues: list[sqlqueue.Queue], port: int
) -> tuple[sqlqueue.Queue, Mailer]:
    queue = backend.queue(encryption_keys=[KEY])
    queues.append(queue)
    mailer = Mailer(
        queue,
        smtp=SMTP(host="127.0.0.1", port=port, starttls=False),
        sender=SENDER,
        backoff=[0],
        secret_fields=["token", "links.reset"],
    )

    @mailer.template("reset")
    def reset(user_name: str, token: str, links: dict[str, str]) -> Content:
        return Content(
            subject="Reset your password",
            text=f"Hello {user_name}, your code is {token}; or open {links['reset']}",
        )

    return queue, mailer


def everything_stored(backend: Backend) -> str:
    """Every column of every job row and ledger row, as the database gives it back as text."""
    with backend.engine.connect() as conn:
        parts = [
            str(value)
            for table in (jobs, email_sent)
            for row in conn.execute(sa.select(*(sa.cast(column, sa.Text) for column in table.c)))
            for value in row
        ]
    return "\n".join(parts)


def test_a_secret_in_a_templates_context_is_sealed_in_every_row_and_in_the_email(
    backend: Backend, queues: list[sqlqueue.Queue], server: tuple[SMTPServer, int]
) -> None:
    smtp, port = server
    # bob is answered 452 once: his copy goes out from a follow-up job, whose row holds the
    # same context, enqueued by the worker in the attempt's transaction.
    smtp.refuse_once["bob@example.com"] = "452 4.5.3 Too many recipients"
    queue, mailer = reset_mailer(backend, queues, port)
    token = f"tok-{secrets.token_hex(12)}"
    link = f"https://example.com/reset/{secrets.token_hex(12)}"
    with backend.engine.begin() as conn:
        job_id = mailer.send(
            conn,
            to=["ada@example.com", "bob@example.com"],
            template="reset",
            context={"user_name": "Ada", "token": token, "links": {"reset": link}},
        )
    with backend.engine.connect() as conn:
        stored = conn.execute(sa.select(jobs.c.payload).where(jobs.c.id == job_id)).scalar_one()
    assert set(stored["context"]["token"]) == {MARKER}
    assert set(stored["context"]["links"]["reset"]) == {MARKER}
    assert stored["context"]["user_name"] == "Ada"  # only the named fields are sealed
    shown = job_of(queue, job_id).payload["context"]
    assert (shown["token"], shown["links"]["reset"]) == ("***", "***")
    for secret in (token, link):
        assert secret not in everything_stored(backend)

    for _ in range(5):  # the job, then its follow-up (due after the backoff's 0 s)
        drain(queue)
    done = job_of(queue, job_id)
    assert done.status == "succeeded", done.last_error
    follow_up = job_of(queue, done.result["deferred_job"])
    assert follow_up.status == "succeeded", follow_up.last_error
    assert set(follow_up.payload["context"]) == {"user_name", "token", "links"}
    assert follow_up.payload["context"]["token"] == "***"

    at_rest = everything_stored(backend)
    for secret in (token, link):
        assert secret not in at_rest
    assert [received.recipients for received in smtp.received] == [
        ["ada@example.com"],
        ["bob@example.com"],
    ]
    for received in smtp.received:  # the email itself carries the plaintext
        body = received.message.get_content()
        assert f"your code is {token};" in body
        assert link in body


def test_secret_fields_need_the_queues_keys_and_a_list_of_names(
    backend: Backend, queues: list[sqlqueue.Queue]
) -> None:
    smtp = SMTP(host="127.0.0.1", port=25, starttls=False)
    keyless = backend.queue()
    with pytest.raises(sqlqueue.ConfigurationError, match="no encryption keys"):
        Mailer(keyless, smtp=smtp, sender=SENDER, secret_fields=["token"])
    keyed = backend.queue(encryption_keys=[KEY])
    for bad in ("token", ["token", ""], [3]):
        with pytest.raises(sqlqueue.ConfigurationError, match="secret_fields"):
            Mailer(keyed, smtp=smtp, sender=SENDER, secret_fields=bad)  # type: ignore[arg-type]
