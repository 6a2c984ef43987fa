"""The email kind against a real SMTP server (aiosmtpd on a free port of 127.0.0.1), on the
database backends: delivery and headers, TLS and login, what each SMTP reply does to the job,
the ledger that keeps a message from going out twice, dedup keys, template versions, and bad
input refused before any row is written."""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import circuit_breakers, email_sent, jobs
from sqlqueue.email import SMTP, Content, Mailer
from sqlqueue.email._mailer import deferred_key
from sqlqueue.testing import age_jobs
from tests._support import WorkerThread, count_jobs, db_now, drain, refusing_port, wait_until
from tests.conftest import Backend
from tests.smtp_server import SMTPServer, hung_server, self_signed_certificate

pytestmark = [
    pytest.mark.timeout(60),
    # The login tests use AUTH without TLS on purpose (the TLS test does both).
    pytest.mark.filterwarnings("ignore:Requiring AUTH while not requiring TLS:UserWarning"),
]

#: What the SMTP server's replies do to a job: the subject is the protocol, and what reaches the
#: database goes through the worker's outcome writes that the conformance suite runs on every
#: backend. The ledger, dedup, async-transaction and limit tests below stay on every backend.
SMTP_PROTOCOL = pytest.mark.backend_independent("the SMTP protocol")

SENDER = "Example <noreply@example.com>"
FINAL = {"succeeded", "dead", "cancelled"}


@pytest.fixture
def queues(backend: Backend) -> Iterator[list[sqlqueue.Queue]]:
    """Queues made by a test (``new_queue``); their async engines are disposed at the end."""
    made: list[sqlqueue.Queue] = []
    yield made
    for queue in made:
        if queue._async_engine is not None:
            asyncio.run(queue.async_engine().dispose())


@pytest.fixture
def server() -> Iterator[tuple[SMTPServer, int]]:
    """A plain SMTP server (no TLS, no AUTH) and its port."""
    smtp = SMTPServer()
    with smtp.running() as port:
        yield smtp, port


def new_mailer(
    backend: Backend, queues: list[sqlqueue.Queue], port: int, **options: Any
) -> tuple[sqlqueue.Queue, Mailer]:
    """A queue on ``backend`` and a Mailer sending to 127.0.0.1:``port``, retrying at once."""
    queue = backend.queue()
    queues.append(queue)
    smtp = options.pop("smtp", None) or SMTP(host="127.0.0.1", port=port, starttls=False)
    options.setdefault("backoff", [0])
    mailer = Mailer(queue, smtp=smtp, sender=SENDER, **options)

    @mailer.template("welcome", version="3")
    def welcome(user_name: str) -> Content:
        return Content(
            subject=f"Welcome, {user_name}",
            text=f"Hello {user_name}, welcome aboard.",
            html=f"<p>Hello <b>{user_name}</b>, welcome aboard.</p>",
        )

    return queue, mailer


def send(backend: Backend, mailer: Mailer, **message: Any) -> int:
    """``mailer.send`` in a committed transaction of its own."""
    message.setdefault("to", ["ada@example.com"])
    if "subject" not in message:
        message.setdefault("template", "welcome")
        message.setdefault("context", {"user_name": "Ada"})
    with backend.engine.begin() as conn:
        return mailer.send(conn, **message)


def job_of(queue: sqlqueue.Queue, job_id: int) -> sqlqueue.Job:
    """The job, which must exist."""
    job = queue.get_job(job_id)
    assert job is not None
    return job


def run_until_final(queue: sqlqueue.Queue, job_id: int, rounds: int = 10) -> sqlqueue.Job:
    """Drain until the job is finished (its retries are due at once)."""
    for _ in range(rounds):
        drain(queue)
        job = job_of(queue, job_id)
        if job.status in FINAL:
            return job
    raise AssertionError(f"job {job_id} is still {job.status}")


def ledger(engine: sa.Engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        return [dict(row) for row in conn.execute(sa.select(email_sent)).mappings()]


# -- delivery ---------------------------------------------------------------------------------


@SMTP_PROTOCOL
def test_a_templated_message_is_delivered_with_its_headers_and_parts(backend, queues, server):
    smtp, port = server
    queue, mailer = new_mailer(backend, queues, port)
    job_id = send(backend, mailer, to=["Ada Lovelace <ada@example.com>", "bob@example.com"])
    payload = job_of(queue, job_id).payload
    assert payload["template"] == {"name": "welcome", "version": "3"}
    job = run_until_final(queue, job_id)
    assert (job.status, job.attempts) == ("succeeded", 1)

    (received,) = smtp.received
    message = received.message
    assert received.sender == "noreply@example.com"
    assert received.recipients == ["ada@example.com", "bob@example.com"]
    assert message["From"] == SENDER
    assert message["To"] == "Ada Lovelace <ada@example.com>, bob@example.com"
    assert message["Subject"] == "Welcome, Ada"
    assert message["Message-ID"] == payload["message_id"]
    assert payload["message_id"].endswith("@example.com>")
    sent_date = parsedate_to_datetime(message["Date"])
    assert job.started_at is not None
    assert abs((sent_date - job.started_at).total_seconds()) < 60
    assert message.get_content_type() == "multipart/alternative"
    text, html = message.iter_parts()
    assert (text.get_content_type(), html.get_content_type()) == ("text/plain", "text/html")
    assert text.get_content().strip() == "Hello Ada, welcome aboard."
    assert html.get_content().strip() == "<p>Hello <b>Ada</b>, welcome aboard.</p>"

    assert job.result == {
        "message_id": payload["message_id"],
        "reply": "250 2.0.0 Ok: queued as Q1",
        "accepted": ["ada@example.com", "bob@example.com"],
        "refused": {},
        "sent_at": job.result["sent_at"],
        "template": {"name": "welcome", "version": "3", "enqueued_version": "3"},
    }
    (entry,) = ledger(backend.engine)
    assert (entry["key"], entry["message_id"], entry["job_id"]) == (
        payload["message_id"],
        payload["message_id"],
        job_id,
    )
    assert entry["reply"] == "250 2.0.0 Ok: queued as Q1"


@SMTP_PROTOCOL
def test_a_message_without_a_template_records_its_content_hash(backend, queues, server):
    smtp, port = server
    queue, mailer = new_mailer(backend, queues, port)
    job_id = send(backend, mailer, to="ada@example.com", subject="Hi", text="Plain only.")
    job = run_until_final(queue, job_id)
    assert job.status == "succeeded"
    assert job.payload["content"]["hash"].startswith("sha256:")
    assert job.result["content_hash"] == job.payload["content"]["hash"]
    (received,) = smtp.received
    assert received.message.get_content_type() == "text/plain"
    assert received.message.get_content().strip() == "Plain only."


# -- what each reply does: the status-code table ------------------------------------------------


@SMTP_PROTOCOL
@pytest.mark.parametrize("code", [421, 450, 451, 452])
def test_a_4xx_reply_is_retried_with_the_backoff(backend, queues, server, code):
    smtp, port = server
    smtp.data_replies = [f"{code} 4.3.0 Try again later"]
    queue, mailer = new_mailer(backend, queues, port)
    job = run_until_final(queue, send(backend, mailer))
    assert (job.status, job.attempts, len(smtp.received)) == ("succeeded", 2, 1)
    (error,) = job.errors
    assert error.kind == "SMTPTemporaryError"
    assert f"{code} 4.3.0 Try again later" in error.error


@SMTP_PROTOCOL
def test_451_twice_then_accepted_takes_three_attempts_and_delivers_once(backend, queues, server):
    smtp, port = server
    smtp.data_replies = ["451 4.7.1 Greylisted, try again", "451 4.7.1 Greylisted, try again"]
    queue, mailer = new_mailer(backend, queues, port)
    job_id = send(backend, mailer)
    job = run_until_final(queue, job_id)
    assert (job.status, job.attempts, smtp.data_commands, len(smtp.received)) == (
        "succeeded",
        3,
        3,
        1,
    )
    assert [e.kind for e in job.errors] == ["SMTPTemporaryError", "SMTPTemporaryError"]
    assert smtp.received[0].message["Message-ID"] == job.payload["message_id"]


@SMTP_PROTOCOL
@pytest.mark.parametrize("code", [550, 553, 554])
def test_a_5xx_reply_sends_the_job_to_dead_at_once(backend, queues, server, code):
    smtp, port = server
    smtp.data_replies = [f"{code} 5.7.1 Message rejected as spam"]
    queue, mailer = new_mailer(backend, queues, port)
    job = run_until_final(queue, send(backend, mailer))
    assert (job.status, job.attempts, smtp.received) == ("dead", 1, [])
    assert str(job.last_error) == (
        f"SMTPPermanentError: SMTP server 127.0.0.1:{port} answered "
        f"{code} 5.7.1 Message rejected as spam"
    )
    assert job.errors[-1].kind == "SMTPPermanentError"
    assert ledger(backend.engine) == []


@SMTP_PROTOCOL
def test_every_recipient_refused_with_550_is_dead_at_once(backend, queues, server):
    smtp, port = server
    smtp.refuse = {"ada@example.com": "550 5.1.1 <ada@example.com>: Recipient unknown"}
    queue, mailer = new_mailer(backend, queues, port)
    job = run_until_final(queue, send(backend, mailer))
    assert (job.status, job.attempts, smtp.data_commands) == ("dead", 1, 0)
    assert "550 5.1.1 <ada@example.com>: Recipient unknown" in str(job.last_error)


@SMTP_PROTOCOL
def test_a_partial_refusal_succeeds_for_the_accepted_and_records_the_refused(
    backend, queues, server
):
    smtp, port = server
    smtp.refuse = {"bob@example.com": "550 5.1.1 <bob@example.com>: Recipient unknown"}
    queue, mailer = new_mailer(backend, queues, port)
    job_id = send(backend, mailer, to=["ada@example.com", "bob@example.com", "cy@example.com"])
    job = run_until_final(queue, job_id)
    assert (job.status, job.attempts) == ("succeeded", 1)
    assert job.result["accepted"] == ["ada@example.com", "cy@example.com"]
    assert job.result["refused"] == {
        "bob@example.com": "550 5.1.1 <bob@example.com>: Recipient unknown"
    }
    # Sent once, to the accepted only; the job is finished, so it never goes to them again.
    (received,) = smtp.received
    assert received.recipients == ["ada@example.com", "cy@example.com"]
    drain(queue)
    assert smtp.data_commands == 1
    (entry,) = ledger(backend.engine)
    assert entry["refused"] == job.result["refused"]


@pytest.mark.parametrize("code", [451, 452])
def test_a_recipient_refused_with_4xx_gets_the_same_message_from_a_follow_up_job(
    backend, queues, server, code
):
    """The server takes Ada and answers Bob "try again later": the job succeeds for Ada (a
    retry would send her a second copy), and a follow-up job, enqueued with that success,
    sends the same message (Message-ID, headers, template version) to Bob alone."""
    smtp, port = server
    refusal = f"{code} 4.5.3 Too many recipients, try again later"
    smtp.refuse_once = {"bob@example.com": refusal}
    queue, mailer = new_mailer(backend, queues, port)
    to = ["Ada Lovelace <ada@example.com>", "bob@example.com"]
    job_id = send(backend, mailer, to=to, dedup_key="welcome:batch:7")
    job = run_until_final(queue, job_id)
    assert (job.status, job.attempts) == ("succeeded", 1)
    assert job.result["accepted"] == ["ada@example.com"]
    assert job.result["refused"] == {"bob@example.com": refusal}
    assert job.result["deferred"] == ["bob@example.com"]
    follow_up_id = job.result["deferred_job"]
    assert isinstance(follow_up_id, int)
    assert follow_up_id != job_id

    follow_up = run_until_final(queue, follow_up_id)
    assert (follow_up.status, follow_up.attempts) == ("succeeded", 1)
    payload = follow_up.payload
    assert payload["message_id"] == job.payload["message_id"]
    assert payload["to"] == to  # the same To header
    assert payload["recipients"] == ["bob@example.com"]  # sent to Bob alone
    assert payload["template"] == {"name": "welcome", "version": "3"}
    assert payload["context"] == {"user_name": "Ada"}
    assert payload["deferred_from"] == job_id
    assert payload["key"].startswith("welcome:batch:7:deferred:")
    assert follow_up.idempotency_key == payload["key"]
    assert follow_up.result["accepted"] == ["bob@example.com"]
    assert follow_up.result["refused"] == {}
    assert follow_up.result["deferred_from"] == job_id
    assert "deferred" not in follow_up.result

    first, second = smtp.received
    assert [first.recipients, second.recipients] == [["ada@example.com"], ["bob@example.com"]]
    for copy in (first, second):
        assert copy.message["Message-ID"] == job.payload["message_id"]
        assert copy.message["To"] == "Ada Lovelace <ada@example.com>, bob@example.com"
        assert copy.message["Subject"] == "Welcome, Ada"
    drain(queue)
    copies = [r for received in smtp.received for r in received.recipients]
    assert copies.count("ada@example.com") == 1  # one copy each, overall
    assert copies.count("bob@example.com") == 1
    assert smtp.data_commands == 2
    assert sorted(entry["key"] for entry in ledger(backend.engine)) == sorted(
        ["welcome:batch:7", payload["key"]]
    )


@SMTP_PROTOCOL
def test_only_the_4xx_refused_are_deferred_the_5xx_refused_never_retried(backend, queues, server):
    smtp, port = server
    smtp.refuse = {"cy@example.com": "550 5.1.1 <cy@example.com>: Recipient unknown"}
    smtp.refuse_once = {"bob@example.com": "451 4.3.0 Local error, try again"}
    queue, mailer = new_mailer(backend, queues, port)
    to = ["ada@example.com", "bob@example.com", "cy@example.com"]
    job_id = send(backend, mailer, to=to, subject="Hi", text="Plain only.")
    job = run_until_final(queue, job_id)
    assert (job.status, job.attempts) == ("succeeded", 1)
    assert job.result["accepted"] == ["ada@example.com"]
    assert job.result["refused"] == {
        "bob@example.com": "451 4.3.0 Local error, try again",
        "cy@example.com": "550 5.1.1 <cy@example.com>: Recipient unknown",
    }
    assert job.result["deferred"] == ["bob@example.com"]
    follow_up = run_until_final(queue, job.result["deferred_job"])
    assert follow_up.status == "succeeded"
    assert follow_up.payload["recipients"] == ["bob@example.com"]
    assert follow_up.payload["content"] == job.payload["content"]
    assert follow_up.result["content_hash"] == job.result["content_hash"]
    drain(queue)
    assert [r.recipients for r in smtp.received] == [["ada@example.com"], ["bob@example.com"]]
    assert smtp.data_commands == 2
    assert count_jobs(backend.engine) == 2  # no job ever goes to Cy again


def test_the_success_path_run_twice_enqueues_one_follow_up(backend, queues, server):
    """The follow-up's dedup key comes from the message's key and the deferred recipients: when
    the same attempt's success path runs again (here: its ledger entry gone and the job made
    due again, as a crash or a lost lease could leave it), it finds the follow-up it made."""
    smtp, port = server
    smtp.refuse = {"bob@example.com": "452 4.5.3 Too many recipients"}
    queue, mailer = new_mailer(backend, queues, port, backoff=[60])  # the follow-up waits
    job_id = send(backend, mailer, to=["ada@example.com", "bob@example.com"])
    first = run_until_final(queue, job_id)
    follow_up_id = first.result["deferred_job"]
    held = job_of(queue, follow_up_id)
    assert (held.status, held.attempts) == ("queued", 0)
    assert (held.next_run_at - db_now(backend.engine)).total_seconds() > 30  # backoff step 1

    with backend.engine.begin() as conn:
        conn.execute(email_sent.delete())
        conn.execute(
            jobs.update()
            .where(jobs.c.id == job_id)
            .values(status="queued", next_run_at=db_now(backend.engine), finished_at=None)
        )
    again = run_until_final(queue, job_id)
    assert (again.status, again.attempts) == ("succeeded", 2)
    assert len(smtp.received) == 2  # Ada got it twice: the ledger entry was gone
    assert again.result["deferred"] == ["bob@example.com"]
    assert again.result["deferred_job"] == follow_up_id
    assert count_jobs(backend.engine) == 2
    assert count_jobs(backend.engine, idempotency_key=held.idempotency_key) == 1


def test_a_follow_ups_dedup_key_is_stable_and_bounded():
    one = deferred_key("welcome:user:1", ["b@example.com", "a@example.com"])
    assert one == deferred_key("welcome:user:1", ["a@example.com", "b@example.com"])
    assert one != deferred_key("welcome:user:1", ["a@example.com"])
    assert one != deferred_key("welcome:user:2", ["a@example.com", "b@example.com"])
    long = deferred_key("k" * 255, ["a@example.com"])
    assert len(long) <= 255
    assert long != deferred_key("k" * 254 + "j", ["a@example.com"])
    nested = deferred_key(deferred_key("k" * 240, ["a@x.org", "b@x.org"]), ["b@x.org"])
    assert len(nested) <= 255


@SMTP_PROTOCOL
def test_a_dropped_connection_is_retried(backend, queues, server):
    smtp, port = server
    smtp.drops = 1
    queue, mailer = new_mailer(backend, queues, port)
    job = run_until_final(queue, send(backend, mailer))
    assert (job.status, job.attempts, len(smtp.received)) == ("succeeded", 2, 1)
    (error,) = job.errors
    assert error.kind == "SMTPTemporaryError"
    assert "SMTPServerDisconnected" in error.error


@SMTP_PROTOCOL
def test_a_hung_server_costs_one_attempt_bounded_by_the_timeout(backend, queues):
    with hung_server() as port:
        smtp = SMTP(host="127.0.0.1", port=port, starttls=False, timeout=0.5)
        queue, mailer = new_mailer(backend, queues, port, smtp=smtp, backoff=[60])
        job_id = send(backend, mailer)
        drain(queue)
    job = job_of(queue, job_id)
    assert (job.status, job.attempts) == ("failed", 1)  # retried later, with the backoff
    assert str(job.last_error).startswith(
        f"SMTPTemporaryError: SMTP server 127.0.0.1:{port}: no answer within 0.5 s"
    )
    assert (job.errors[0].details or {})["elapsed_seconds"] < 5


@SMTP_PROTOCOL
def test_a_server_that_stalls_after_accepting_the_message_is_not_sent_to_again(
    backend, queues, server
):
    smtp, port = server
    smtp.hang_at_quit = True  # 250 to the data, then no answer to QUIT
    config = SMTP(host="127.0.0.1", port=port, starttls=False, timeout=0.5)
    queue, mailer = new_mailer(backend, queues, port, smtp=config)
    job = run_until_final(queue, send(backend, mailer))
    assert (job.status, job.attempts, len(smtp.received)) == ("succeeded", 1, 1)


@SMTP_PROTOCOL
def test_a_server_that_is_down_is_retried(backend, queues):
    with refusing_port() as port:  # bound, not listening: connections are refused
        queue, mailer = new_mailer(backend, queues, port, backoff=[60])
        job_id = send(backend, mailer)
        drain(queue)
    job = job_of(queue, job_id)
    assert (job.status, job.attempts) == ("failed", 1)
    assert job.errors[0].kind == "SMTPTemporaryError"


# -- TLS, login, secrets ------------------------------------------------------------------------


def tls_contexts(directory: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The server's context with a fresh self-signed certificate, and a client's trusting it."""
    cert, key = self_signed_certificate(directory)
    server_side = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_side.load_cert_chain(cert, key)
    return server_side, ssl.create_default_context(cafile=str(cert))


PASSWORD = "s3cret-Pa55"


@SMTP_PROTOCOL
def test_starttls_with_a_self_signed_certificate_and_login(backend, queues, tmp_path):
    server_side, client_side = tls_contexts(tmp_path)
    smtp = SMTPServer()
    with smtp.running(tls_context=server_side, auth=True) as port:
        config = SMTP(
            host="127.0.0.1",
            port=port,
            starttls=True,
            tls_context=client_side,
            username="app",
            password=PASSWORD,
        )
        queue, mailer = new_mailer(backend, queues, port, smtp=config)
        job = run_until_final(queue, send(backend, mailer))
    assert (job.status, job.attempts, len(smtp.received)) == ("succeeded", 1, 1)
    assert smtp.logins == ["app"]  # the server requires STARTTLS before AUTH and MAIL


@SMTP_PROTOCOL
def test_an_untrusted_certificate_is_retried(backend, queues, tmp_path):
    server_side, _ = tls_contexts(tmp_path)
    smtp = SMTPServer()
    with smtp.running(tls_context=server_side) as port:
        config = SMTP(host="127.0.0.1", port=port, starttls=True)  # the system's CAs only
        queue, mailer = new_mailer(backend, queues, port, smtp=config, backoff=[60])
        job_id = send(backend, mailer)
        drain(queue)
    job = job_of(queue, job_id)
    assert (job.status, job.attempts, smtp.received) == ("failed", 1, [])
    assert "CERTIFICATE_VERIFY_FAILED" in str(job.last_error)


@SMTP_PROTOCOL
def test_a_server_without_the_starttls_the_settings_ask_for_is_dead_at_once(
    backend, queues, server
):
    smtp, port = server
    config = SMTP(host="127.0.0.1", port=port, starttls=True)
    queue, mailer = new_mailer(backend, queues, port, smtp=config)
    job = run_until_final(queue, send(backend, mailer))
    assert (job.status, job.attempts, smtp.received) == ("dead", 1, [])
    assert "STARTTLS extension not supported" in str(job.last_error)
    assert str(job.last_error).endswith("check the Mailer's SMTP settings")


@SMTP_PROTOCOL
def test_a_refused_login_is_dead_at_once(backend, queues):
    smtp = SMTPServer()
    with smtp.running(auth=True) as port:
        config = SMTP(
            host="127.0.0.1", port=port, starttls=False, username="app", password="not-it-123"
        )
        queue, mailer = new_mailer(backend, queues, port, smtp=config)
        job = run_until_final(queue, send(backend, mailer))
    assert (job.status, job.attempts, smtp.received) == ("dead", 1, [])
    assert str(job.last_error).startswith(
        f"SMTPPermanentError: SMTP server 127.0.0.1:{port} answered 535"
    )


@SMTP_PROTOCOL
def test_the_password_is_never_in_a_row_an_error_or_a_log_line(backend, queues, caplog):
    caplog.set_level(logging.DEBUG)
    smtp = SMTPServer()
    with smtp.running(auth=True) as port:
        good = SMTP(host="127.0.0.1", port=port, starttls=False, username="app", password=PASSWORD)
        queue, mailer = new_mailer(backend, queues, port, smtp=good)
        ok = run_until_final(queue, send(backend, mailer))
        bad_password = "Wr0ng-but-secret-77"
        bad = SMTP(
            host="127.0.0.1", port=port, starttls=False, username="app", password=bad_password
        )
        other = backend.queue()
        queues.append(other)
        refused = Mailer(other, smtp=bad, sender=SENDER, name="email_bad")
        with backend.engine.begin() as conn:
            job_id = refused.send(conn, to="ada@example.com", subject="Hi", text="…")
        dead = run_until_final(other, job_id)
    assert (ok.status, dead.status) == ("succeeded", "dead")
    with backend.engine.connect() as conn:
        rows = [
            repr(tuple(row)) for row in conn.execute(sa.text("SELECT * FROM sqlqueue_jobs"))
        ] + [repr(tuple(row)) for row in conn.execute(sa.select(email_sent))]
    ours = [r for r in caplog.records if not r.name.startswith("mail.log")]  # not aiosmtpd's
    everything = "\n".join(
        [*rows, *(r.getMessage() for r in ours), repr(mailer), repr(good), repr(dead)]
    )
    assert ours, "the worker logged nothing?"
    for secret in (PASSWORD, bad_password):
        assert secret not in everything
    assert "535" in str(dead.last_error)


# -- sent once where it can be ------------------------------------------------------------------


@pytest.mark.timeout(240)  # two worker processes start one after the other (the module's is 60)
def test_a_crash_between_the_send_and_the_commit_resends_with_the_same_message_id(
    backend, server, tmp_path
):
    """Two deliveries, both with the job's one Message-ID: the server accepted the first, then
    the worker died before the transaction carrying the ledger entry and the job's success
    committed. Nothing durable says the message went out, so the next attempt must send it
    again (dropping it could lose the email); the unchanged Message-ID lets the receiver
    recognise the duplicate. This is the window the README states."""
    from tests.apps.processes import REPO_ROOT, child_env

    smtp, port = server
    producer = backend.queue()
    producer_mailer = Mailer(producer, smtp=SMTP(host="127.0.0.1", port=port), sender=SENDER)
    producer_mailer.template("welcome", version="1")(lambda user_name: None)
    job_id = send(backend, producer_mailer, dedup_key="welcome:user:1")
    env = child_env(
        backend.url,
        EMAIL_SMTP_PORT=str(port),
        EMAIL_CRASH_MARKER=str(tmp_path / "crashed"),
        # Long enough that a live worker's heartbeat never misses it on a loaded machine: the
        # dead worker's lease is aged below (by an hour), not waited for.
        EMAIL_LEASE_SECONDS="20",
    )
    command = [
        sys.executable,
        *("-m", "sqlqueue", "worker", "tests.apps.email_app:queue"),
        *("--poll-interval", "0.05", "--burst"),
    ]
    first = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, timeout=100)
    assert first.returncode == -signal.SIGKILL, first.stderr.decode()
    assert len(smtp.received) == 1  # the server has it
    assert ledger(backend.engine) == []  # rolled back with the job's success
    assert job_of(producer, job_id).status == "running"
    # Its worker is dead: its lease runs out (aged, not waited for); the next worker's
    # reaper gives the job back and runs it.
    age_jobs(producer, [job_id], by=timedelta(hours=1))

    def rerun() -> bool:
        subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, timeout=100)
        return job_of(producer, job_id).status == "succeeded"

    wait_until(rerun, timeout=150, interval=0.1, what="a second worker to rerun the job")
    job = job_of(producer, job_id)
    assert (job.status, job.attempts) == ("succeeded", 2)
    first_copy, second_copy = smtp.received
    assert first_copy.message["Message-ID"] == second_copy.message["Message-ID"]
    assert second_copy.message["Message-ID"] == job.payload["message_id"]
    assert [entry["key"] for entry in ledger(backend.engine)] == ["welcome:user:1"]


def test_a_key_found_in_the_ledger_is_not_sent_again(backend, queues, server):
    smtp, port = server
    queue, mailer = new_mailer(backend, queues, port)
    first = run_until_final(queue, send(backend, mailer, dedup_key="welcome:user:1"))
    with backend.engine.begin() as conn:  # the job row is pruned; the ledger stays
        conn.execute(sa.text("DELETE FROM sqlqueue_jobs"))
    job_id = send(backend, mailer, dedup_key="welcome:user:1")
    again = run_until_final(queue, job_id)
    assert again.status == "succeeded"
    assert len(smtp.received) == 1
    assert again.result["already_sent"] is True
    assert again.payload["message_id"] != first.result["message_id"]  # minted anew at enqueue
    assert again.result["message_id"] == first.result["message_id"]  # the one that went out
    assert again.result["sent_by_job"] == first.id
    assert again.result["reply"] == first.result["reply"]


def test_the_same_dedup_key_twice_makes_one_job_and_one_message(backend, queues, server):
    smtp, port = server
    queue, mailer = new_mailer(backend, queues, port)
    with backend.engine.begin() as conn:
        first = mailer.send(conn, to="ada@example.com", subject="Hi", text="1", dedup_key="n:42")
        second = mailer.send(conn, to="ada@example.com", subject="Hi", text="1", dedup_key="n:42")
    third = send(backend, mailer, dedup_key="n:42")
    assert first == second == third
    assert count_jobs(backend.engine) == 1
    run_until_final(queue, first)
    assert len(smtp.received) == 1


def test_send_async_enqueues_in_the_callers_async_transaction(backend, queues, server):
    smtp, port = server
    queue, mailer = new_mailer(backend, queues, port)

    async def enqueue() -> int:
        engine = queue.async_engine()
        async with engine.begin() as conn:
            return await mailer.send_async(
                conn, to="ada@example.com", template="welcome", context={"user_name": "Ada"}
            )

    job_id = asyncio.run(enqueue())
    assert run_until_final(queue, job_id).status == "succeeded"
    assert len(smtp.received) == 1


# -- template versions --------------------------------------------------------------------------


def redeploy(
    backend: Backend, queues: list[sqlqueue.Queue], port: int, **options: Any
) -> tuple[sqlqueue.Queue, Mailer]:
    """The worker after a deploy: the same Mailer, with template ``welcome`` at version 4."""
    queue = backend.queue()
    queues.append(queue)
    smtp = SMTP(host="127.0.0.1", port=port, starttls=False)
    mailer = Mailer(queue, smtp=smtp, sender=SENDER, backoff=[0], **options)

    @mailer.template("welcome", version="4")
    def welcome(user_name: str) -> Content:
        return Content(subject=f"Welcome aboard, {user_name}", text="v4")

    return queue, mailer


@SMTP_PROTOCOL
def test_a_template_changed_since_enqueue_renders_the_new_version(backend, queues, server):
    smtp, port = server
    _, before = new_mailer(backend, queues, port)
    job_id = send(backend, before)
    after, _ = redeploy(backend, queues, port, on_template_change="render_new")
    job = run_until_final(after, job_id)
    assert job.status == "succeeded"
    assert job.payload["template"] == {"name": "welcome", "version": "3"}
    assert job.result["template"] == {"name": "welcome", "version": "4", "enqueued_version": "3"}
    assert smtp.received[0].message["Subject"] == "Welcome aboard, Ada"


@SMTP_PROTOCOL
def test_a_template_changed_since_enqueue_can_fail_the_job(backend, queues, server):
    smtp, port = server
    _, before = new_mailer(backend, queues, port)
    job_id = send(backend, before)
    after, _ = redeploy(backend, queues, port, on_template_change="fail")
    job = run_until_final(after, job_id)
    assert (job.status, job.attempts, smtp.received) == ("dead", 1, [])
    assert str(job.last_error) == (
        "TemplateChanged: template 'welcome' is version 4 now, the job was enqueued for "
        "version 3 (on_template_change='fail')"
    )


# -- bad input: refused before any row ----------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "error", "text"),
    [
        (
            {"template": "farewell"},
            "UnknownTemplate",
            "no template named 'farewell' (registered: welcome)",
        ),
        ({"to": "not an address"}, "InvalidAddress", "'not an address' is not a valid"),
        ({"to": "a@"}, "InvalidAddress", "to[0]: 'a@' is not a valid email address"),
        ({"to": "a@x.org, b@x.org"}, "InvalidAddress", "must be one address, not 2"),
        ({"to": []}, "InvalidAddress", "to: expected an address or a non-empty list"),
        ({"to": "ada@example.com\r\nBcc: x@y.z"}, "InvalidAddress", "contains a line break"),
        ({"context": {}}, "EmailInputError", "missing a required argument: 'user_name'"),
        ({"context": {"user_name": "Ada", "age": 3}}, "EmailInputError", "unexpected keyword"),
        ({"context": {"user_name": {1, 2}}}, "PayloadError", "is a set"),
        ({"subject": "Hi", "template": "welcome"}, "EmailInputError", "not both"),
        ({"subject": "Hi"}, "EmailInputError", "subject= and text="),
        ({"subject": "Hi\nBcc: x@y.z", "text": "t"}, "EmailInputError", "one line"),
    ],
)
def test_bad_input_is_refused_before_any_row_is_written(backend, queues, message, error, text):
    _, mailer = new_mailer(backend, queues, 25)
    if "subject" in message:
        message.setdefault("to", "ada@example.com")
        if message.get("template"):
            message["context"] = {"user_name": "Ada"}
    with backend.engine.begin() as conn:
        with pytest.raises(sqlqueue.EnqueueError) as raised:
            send_in(conn, mailer, message)
        assert type(raised.value).__name__ == error
        assert text in str(raised.value)
        conn.execute(sa.text("SELECT 1"))  # the caller's transaction is still usable
    assert count_jobs(backend.engine) == 0


def send_in(conn: sa.Connection, mailer: Mailer, message: dict[str, Any]) -> int:
    message.setdefault("to", "ada@example.com")
    if "subject" not in message:
        message.setdefault("template", "welcome")
        message.setdefault("context", {"user_name": "Ada"})
    return mailer.send(conn, **message)


def test_a_mailer_checks_its_settings(backend):
    queue = backend.queue()
    smtp = SMTP(host="127.0.0.1", port=25, starttls=False)
    with pytest.raises(sqlqueue.ConfigurationError, match="sender: 'nobody' is not a valid"):
        Mailer(queue, smtp=smtp, sender="nobody")
    with pytest.raises(sqlqueue.ConfigurationError, match="on_template_change must be"):
        Mailer(queue, smtp=smtp, sender=SENDER, on_template_change="ignore")  # type: ignore[arg-type]
    with pytest.raises(
        sqlqueue.ConfigurationError, match=r"rate_limit must be a sqlqueue\.RateLimit"
    ):
        Mailer(queue, smtp=smtp, sender=SENDER, rate_limit=5)  # type: ignore[arg-type]
    Mailer(queue, smtp=smtp, sender=SENDER)
    with pytest.raises(sqlqueue.ConfigurationError, match="a task named 'email' is already"):
        Mailer(queue, smtp=smtp, sender=SENDER)  # a second Mailer needs name=
    with pytest.raises(sqlqueue.ConfigurationError, match="exclude each other"):
        SMTP(host="h", starttls=True, use_tls=True)
    with pytest.raises(sqlqueue.ConfigurationError, match="go together"):
        SMTP(host="h", username="app")
    with pytest.raises(sqlqueue.ConfigurationError, match="timeout must be > 0"):
        SMTP(host="h", timeout=0)


# -- flow control -------------------------------------------------------------------------------


def test_the_circuit_breaker_and_rate_limit_are_keyed_by_the_provider(backend, queues, server):
    smtp, port = server
    smtp.drops = 1
    queue, mailer = new_mailer(
        backend,
        queues,
        port,
        backoff=[60],
        rate_limit=sqlqueue.RateLimit(per_second=100),
        circuit_breaker=sqlqueue.CircuitBreaker(failure_threshold=1, cooldown_seconds=60),
    )
    provider = f"smtp:127.0.0.1:{port}"
    assert mailer.task.rate_limit is not None
    assert mailer.task.rate_limit.key == provider
    assert mailer.task.circuit_breaker is not None
    assert mailer.task.circuit_breaker.key == provider
    first = send(backend, mailer)
    drain(queue)
    assert job_of(queue, first).status == "failed"  # the dropped connection opened the breaker
    second = send(backend, mailer)
    drain(queue)
    held = job_of(queue, second)
    assert (held.status, held.attempts) == ("queued", 0)  # deferred, not failed
    assert smtp.data_commands == 1
    with backend.engine.connect() as conn:
        state = conn.execute(
            sa.select(circuit_breakers.c.state).where(circuit_breakers.c.key == provider)
        ).scalar_one()
    assert state == "open"


def test_an_async_template_and_an_orm_session(backend, queues, server):
    from sqlalchemy.orm import Session

    smtp, port = server
    queue, mailer = new_mailer(backend, queues, port)

    @mailer.template("receipt", version="2")
    async def receipt(order: int) -> Content:
        await asyncio.sleep(0)
        return Content(subject=f"Receipt for order {order}", text="Thanks.")

    with Session(backend.engine) as session, session.begin():
        job_id = mailer.send(
            session, to="ada@example.com", template="receipt", context={"order": 7}
        )
    assert mailer.templates == {"welcome": "3", "receipt": "2"}
    job = run_until_final(queue, job_id)
    assert job.result["template"] == {"name": "receipt", "version": "2", "enqueued_version": "2"}
    assert smtp.received[0].message["Subject"] == "Receipt for order 7"


@SMTP_PROTOCOL
def test_non_ascii_names_subjects_and_bodies_arrive_intact(backend, queues, server):
    smtp, port = server
    queue, mailer = new_mailer(backend, queues, port)
    job_id = send(
        backend,
        mailer,
        to="Ада Лавлейс <ada@example.com>",
        subject="Добро пожаловать ✉",
        text="Здравствуйте, Ада! 🎉",
    )
    assert run_until_final(queue, job_id).status == "succeeded"
    (received,) = smtp.received
    assert received.message["To"] == "Ада Лавлейс <ada@example.com>"
    assert received.message["Subject"] == "Добро пожаловать ✉"
    assert received.message.get_content().strip() == "Здравствуйте, Ада! 🎉"


# -- reused connections -------------------------------------------------------------------------


@SMTP_PROTOCOL
def test_a_pool_sends_many_messages_over_one_connection(backend, queues, server):
    smtp, port = server
    config = SMTP(host="127.0.0.1", port=port, starttls=False, pool_size=2)
    queue, mailer = new_mailer(backend, queues, port, smtp=config)
    ids = [send(backend, mailer, to=f"user{n}@example.com") for n in range(4)]
    drain(queue, concurrency=1)
    assert [job_of(queue, job_id).status for job_id in ids] == ["succeeded"] * 4
    assert len(smtp.received) == 4
    assert len(set(smtp.peers)) == 1


@SMTP_PROTOCOL
def test_a_kept_connection_the_server_closed_is_replaced_without_a_failed_attempt(backend, queues):
    smtp = SMTPServer()
    # The server drops connections idle for 2 s: idle between two jobs, which the test waits
    # for, but never within one message's commands (at 0.2 s a loaded machine's pause between
    # MAIL and RCPT was taken for idleness, and the send failed).
    with smtp.running(timeout=2.0) as port:
        config = SMTP(host="127.0.0.1", port=port, starttls=False, pool_size=1)
        queue, mailer = new_mailer(backend, queues, port, smtp=config)
        with WorkerThread(queue.worker(concurrency=1, poll_interval=0.02)):
            first = send(backend, mailer, to="ada@example.com")
            wait_until(lambda: job_of(queue, first).status == "succeeded")
            [kept] = smtp.peers
            wait_until(lambda: kept in smtp.closed)  # the server dropped the kept connection
            second = send(backend, mailer, to="bob@example.com")
            wait_until(lambda: job_of(queue, second).status == "succeeded")
    assert [job_of(queue, job_id).attempts for job_id in (first, second)] == [1, 1]
    assert len(smtp.received) == 2
    assert len(set(smtp.peers)) == 2
