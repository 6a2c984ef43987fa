"""A sign-up and its background jobs, end to end, with a real mail server and a real CRM receiver.

Run it as it is (an SQLite file in a temporary directory)::

    pip install -e ".[demo]"
    python examples/signup_demo.py
    python examples/signup_demo.py --database-url postgresql+psycopg://user@host/db

The program starts its own services on free ports of 127.0.0.1 and talks to nothing else:

- a mail server (aiosmtpd, in a thread) that answers "421 too busy" to the first message;
- a CRM that receives webhooks (a small HTTP server, in a thread). It is down at first (it answers
  503) and, once back, checks every request's signature with :func:`sqlqueue.webhooks.verify`.

What it shows, in order:

1. A sign-up writes the user row AND its three jobs in ONE transaction: the welcome email (through
   the :class:`~sqlqueue.email.Mailer`, from a template, with a dedup key), the CRM's
   ``user.created`` webhook (through :meth:`~sqlqueue.webhooks.Webhooks.deliver`) and an
   analytics event (a plain task).
2. A double-submit of the same form enqueues nothing new: the keys return the existing jobs.
3. A sign-up whose transaction rolls back leaves neither a user nor a job behind.
4. A worker runs the jobs. The email is retried once and arrives; the CRM answers 503, so the
   delivery retries on a short backoff and ends ``dead``.
5. The mail server holds the message under the Message-ID and Subject the job recorded.
6. The CRM comes back and support requeues the dead delivery as they would in production, with
   ``sqlqueue dead requeue --type sqlqueue.webhooks.deliver --by … --reason …`` (a subprocess on
   the same database). The new job delivers the same message, under the same ``webhook-id``; the
   CRM verifies its signature and records the contact, and refuses a tampered copy.

The program checks every claim it prints and exits 1 if anything differs (2 if the database
already holds a previous run). It takes a few seconds.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email import message_from_bytes, policy
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import sqlqueue

try:
    from aiosmtpd.controller import Controller

    from sqlqueue.email import SMTP, Content, Mailer
    from sqlqueue.webhooks import TASK_NAME, Webhooks, WebhookVerificationError, verify
except ImportError as missing:  # pragma: no cover - depends on the installation
    raise SystemExit(f'{missing}: the demo needs its extra: pip install -e ".[demo]"') from None

URL_VARIABLE = "SQLQUEUE_DATABASE_URL"
SUPPORT = "support@example.com"
REQUEUE_REASON = "CRM is back"

# -- the application's own tables (SQLAlchemy Core) -------------------------------------------

app_metadata = sa.MetaData()

users = sa.Table(
    "demo_users",
    app_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("email", sa.String(255), nullable=False, unique=True),
    sa.Column("name", sa.String(255), nullable=False),
)

#: What the analytics job records: one row per sign-up, written in the job's own transaction.
analytics_events = sa.Table(
    "demo_analytics_events",
    app_metadata,
    sa.Column("dedup_key", sa.String(255), primary_key=True),
    sa.Column("event", sa.String(100), nullable=False),
    sa.Column("user_id", sa.Integer, nullable=False),
)

sqlqueue_jobs = sa.table("sqlqueue_jobs", sa.column("id"))

# -- the mail server: aiosmtpd on 127.0.0.1 --------------------------------------------------


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now (aiosmtpd needs a number)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class MailServer:
    """An aiosmtpd handler: answers "421 too busy" to the first ``busy`` messages (a real
    provider under load does), then accepts and keeps every message, parsed."""

    busy: int = 1
    received: list[EmailMessage] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        with self._lock:
            if self.busy > 0:
                self.busy -= 1
                return "421 4.7.0 mail.example.com: too busy, try again later"
            message = message_from_bytes(envelope.content, policy=policy.default)
            assert isinstance(message, EmailMessage)
            self.received.append(message)
            return f"250 2.0.0 Ok: queued as Q{len(self.received)}"


@contextmanager
def running_mail_server(handler: MailServer) -> Iterator[int]:
    """Serve ``handler`` on a free port of 127.0.0.1 (yielded) until the block ends."""
    port = free_port()
    controller = Controller(handler, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port
    finally:
        controller.stop()


# -- the CRM: a webhook receiver on 127.0.0.1 ------------------------------------------------


@dataclass(frozen=True)
class CrmRequest:
    """One request the CRM got, and what it made of it."""

    webhook_id: str
    status: int
    headers: dict[str, str]
    body: bytes
    #: The verified payload, or ``None`` when the CRM was down or the signature did not hold.
    event: Any
    #: Why the signature was refused, if it was.
    refused: str | None = None


class Crm:
    """The partner's CRM, as its webhook endpoint would behave.

    While ``up`` is false it answers 503 (down for maintenance) without reading the message.
    Once up, it does what any receiver should: :func:`verify` the signature with the secret it
    was given (400 if it does not hold), drop a ``webhook-id`` it has processed already (the
    sender reuses it on every attempt), record the contact, answer 200.
    """

    def __init__(self) -> None:
        self.up = False
        self.secret: str | None = None
        self.contacts: dict[int, str] = {}
        self.requests: list[CrmRequest] = []
        self._processed: set[str] = set()
        self._lock = threading.Lock()
        crm = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the demo prints :attr:`Crm.requests` instead."""

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {name.lower(): value for name, value in self.headers.items()}
                status, text = crm.receive(headers, body)
                reply = text.encode("utf-8")
                self.send_response(status)
                self.send_header("content-type", "text/plain")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/hooks"

    def receive(self, headers: dict[str, str], body: bytes) -> tuple[int, str]:
        """Answer one request: its status and a short body."""
        webhook_id = headers.get("webhook-id", "?")
        with self._lock:
            if not self.up:
                self.requests.append(CrmRequest(webhook_id, 503, headers, body, None))
                return 503, "CRM down for maintenance"
            assert self.secret is not None, "the CRM is up but was never given its secret"
            try:
                event = verify(self.secret, headers, body)
            except WebhookVerificationError as error:
                self.requests.append(CrmRequest(webhook_id, 400, headers, body, None, str(error)))
                return 400, f"bad signature: {error}"
            self.requests.append(CrmRequest(webhook_id, 200, headers, body, event))
            if webhook_id not in self._processed:
                self._processed.add(webhook_id)
                if event["type"] == "user.created":
                    self.contacts[event["data"]["user_id"]] = event["data"]["email"]
            return 200, "ok"

    def __enter__(self) -> Crm:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


# -- the queue and its tasks -----------------------------------------------------------------


@dataclass
class App:
    """The demo application: its engine, queue, mailer, webhooks and the analytics task."""

    engine: sa.Engine
    queue: sqlqueue.Queue
    mailer: Mailer
    hooks: Webhooks
    track_signup: sqlqueue.Task


def build_app(engine: sa.Engine, smtp_port: int) -> App:
    """Register the three kinds of job on a queue bound to ``engine``.

    Retry delays are fractions of a second so the story fits in a few seconds; in production
    they are minutes to hours (the Mailer's and Webhooks' defaults).
    """
    queue = sqlqueue.Queue(engine, lease_seconds=10.0)

    mailer = Mailer(
        queue,
        smtp=SMTP(host="127.0.0.1", port=smtp_port, starttls=False, timeout=5.0),
        sender="Example <hello@example.com>",
        max_attempts=3,
        backoff=[0.5],
    )

    @mailer.template("welcome", version="1")
    def welcome(name: str) -> Content:
        return Content(
            subject=f"Welcome, {name}!",
            text=f"Hi {name}, thanks for signing up.",
            html=f"<p>Hi <b>{name}</b>, thanks for signing up.</p>",
        )

    hooks = Webhooks(
        queue,
        timeout=5.0,
        max_attempts=3,
        backoff=[0.3, 0.6],
        # The SSRF guard refuses loopback and private addresses by default: a partner's URL must
        # not be a way into our own network. The demo's CRM listens on 127.0.0.1 in this very
        # process, so it is allowed here; never do this for URLs that partners give you.
        allow_private_addresses=True,
    )

    @queue.task("track_signup", queue="analytics")
    def track_signup(user_id: int, ctx: sqlqueue.JobContext) -> None:
        # The event row commits in the same transaction as the job's success, or not at all:
        # an attempt that fails or dies half-way leaves nothing, so the event counts once.
        with ctx.transaction() as conn:
            conn.execute(
                sa.insert(analytics_events).values(
                    dedup_key=f"analytics:signup:user:{user_id}", event="signup", user_id=user_id
                )
            )

    return App(engine=engine, queue=queue, mailer=mailer, hooks=hooks, track_signup=track_signup)


# -- the request path ------------------------------------------------------------------------


class SignupRejected(Exception):
    """Something after the user row failed, so the whole sign-up rolls back."""


@dataclass(frozen=True)
class Signup:
    """What a sign-up request produced: the user and the ids of its jobs."""

    user_id: int
    job_ids: dict[str, int]


def sign_up(app: App, conn: sa.Connection, *, email: str, name: str) -> Signup:
    """Create the user (or find it, on a double-submit) and enqueue its jobs in ``conn``'s
    transaction: they all commit together or none does. Each job has a key derived from the
    user, so submitting the form twice enqueues each job once."""
    user_id = conn.scalar(sa.select(users.c.id).where(users.c.email == email))
    if user_id is None:
        user_id = conn.execute(
            sa.insert(users).values(email=email, name=name).returning(users.c.id)
        ).scalar_one()
    job_ids = {
        "email": app.mailer.send(
            conn,
            to=f"{name} <{email}>",
            template="welcome",
            context={"name": name},
            dedup_key=f"welcome:user:{user_id}",
        ),
        "crm": app.hooks.deliver(
            conn,
            endpoint="crm",
            event_type="user.created",
            data={"user_id": user_id, "email": email},
            idempotency_key=f"crm:user:{user_id}:created",
        ),
        "analytics": app.track_signup.options(
            idempotency_key=f"analytics:signup:user:{user_id}"
        ).enqueue(conn, user_id=user_id),
    }
    return Signup(user_id=user_id, job_ids=job_ids)


# -- running workers and the operator's command ----------------------------------------------

UNFINISHED = {sqlqueue.JobStatus.QUEUED, sqlqueue.JobStatus.RUNNING, sqlqueue.JobStatus.FAILED}


def run_workers_until_settled(app: App, job_ids: Iterable[int], *, limit: float = 30.0) -> None:
    """Run burst workers until every job in ``job_ids`` is finished (succeeded or dead).

    A burst worker returns when nothing is due; a retry scheduled in the future is not due yet,
    so wait until the earliest one and run another burst.
    """
    ids = list(job_ids)
    deadline = time.monotonic() + limit
    while True:
        app.queue.worker(concurrency=4, poll_interval=0.05).run(burst=True)
        waiting = [job for job in map(app.queue.get_job, ids) if job and job.status in UNFINISHED]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"jobs still unfinished after {limit:.0f} s: {waiting}")
        soonest = min(job.next_run_at for job in waiting)
        time.sleep(min(max((soonest - datetime.now(UTC)).total_seconds(), 0.02), 1.0))


def operator(database_url: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    """Run ``sqlqueue ARGUMENTS`` as support would, in a process of its own, and print it.

    The database URL goes in ``SQLQUEUE_DATABASE_URL`` rather than ``--database-url``: a
    password in the environment is not on display in the process list.
    """
    print(f"  $ sqlqueue {shlex.join(arguments)}")
    result = subprocess.run(
        [sys.executable, "-m", "sqlqueue", *arguments],
        env={**os.environ, URL_VARIABLE: database_url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    for line in (result.stdout + result.stderr).splitlines():
        print(f"  {line}")
    return result


# -- printing --------------------------------------------------------------------------------


def heading(text: str) -> None:
    print(f"\n== {text}")


def describe(job: sqlqueue.Job) -> str:
    attempts = f"{job.attempts}/{job.max_attempts}"
    line = f"job {job.id:<3} {job.job_type:<25} {job.status.value:<9} attempts {attempts}"
    if job.idempotency_key:
        line += f"  key {job.idempotency_key}"
    if job.requeued_from is not None:
        line += f"  (requeued from job {job.requeued_from})"
    return line


def describe_in_full(job: sqlqueue.Job) -> list[str]:
    lines = [describe(job)]
    for record in job.errors:
        at = f"{record.at:%H:%M:%S.%f}"[:-3]
        lines.append(f"    attempt {record.attempt} failed at {at}: {record.error}")
    if job.requeued_as is not None:
        at = f"{job.requeued_at:%H:%M:%S}" if job.requeued_at else "?"
        lines.append(
            f"    requeued as job {job.requeued_as} by {job.requeued_by} at {at}: "
            f"{job.requeue_reason}"
        )
    return lines


def show_jobs(app: App, job_ids: Iterable[int], *, full: bool = False) -> None:
    for job_id in job_ids:
        job = app.queue.get_job(job_id)
        if job is None:
            print(f"  job {job_id}: no such job")
            continue
        for line in describe_in_full(job) if full else [describe(job)]:
            print(f"  {line}")


def fetch(queue: sqlqueue.Queue, job_id: int) -> sqlqueue.Job:
    job = queue.get_job(job_id)
    if job is None:
        raise SystemExit(f"job {job_id} has vanished")
    return job


def count_rows(engine: sa.Engine, table: sa.TableClause) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(sa.select(sa.func.count()).select_from(table)) or 0)


def holding_rows(engine: sa.Engine) -> list[str]:
    """The tables the demo would write to that hold rows already (a previous run, or someone
    else's data): checked before anything is created, so such a database is left untouched."""
    names = ["sqlqueue_jobs", "sqlqueue_webhook_endpoints", users.name, analytics_events.name]
    with engine.connect() as conn:
        present = set(sa.inspect(conn).get_table_names())
        return [name for name in names if name in present and count_rows(engine, sa.table(name))]


def post(url: str, headers: dict[str, str], body: bytes) -> int:
    """POST ``body`` to ``url`` (the demo's own CRM) and return the status it answers.

    Only the ``webhook-*`` and ``content-type`` headers are sent along (urllib sets the length),
    and no proxy from the environment is used: the request goes straight to 127.0.0.1.
    """
    kept = {k: v for k, v in headers.items() if k.startswith("webhook-") or k == "content-type"}
    request = urllib.request.Request(url, data=body, headers=kept, method="POST")
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with direct.open(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


class Checks:
    """What the narrative claims, checked; any miss makes the program exit 1."""

    def __init__(self) -> None:
        self.misses: list[str] = []

    def expect(self, condition: bool, claim: str) -> None:
        if not condition:
            self.misses.append(claim)
            print(f"  !! UNEXPECTED: {claim} does not hold")


# -- the story -------------------------------------------------------------------------------


def run_demo(engine: sa.Engine, mail: MailServer, smtp_port: int, crm: Crm) -> int:
    checks = Checks()
    # The Queue first: it sets up every connection the engine opens from now on (on SQLite:
    # WAL and a 30 s busy timeout), so no connection in the pool misses it.
    app = build_app(engine, smtp_port)
    queue = app.queue
    held = holding_rows(engine)
    if held:
        print(f"this database already has rows in {', '.join(held)}; ", end="")
        print("point --database-url at a new one")
        return 2
    sqlqueue.migrate(engine)
    app_metadata.create_all(engine)
    database_url = engine.url.render_as_string(hide_password=False)

    heading("0. The partner's CRM is registered as a webhook endpoint")
    with engine.begin() as conn:
        endpoint = app.hooks.add_endpoint(conn, name="crm", url=crm.url)
    crm.secret = endpoint.secret  # what the partner is given, out of band
    print(f"  mail server: aiosmtpd at 127.0.0.1:{smtp_port} (answers 421 to the first message)")
    print(f"  CRM:         endpoint 'crm' -> {endpoint.url} (down: answers 503)")
    print(f"  signing secret {endpoint.secret[:10]}… handed to the CRM")

    heading("1. Ada signs up: the user row and its three jobs are written in ONE transaction")
    with engine.begin() as conn:
        ada = sign_up(app, conn, email="ada@example.com", name="Ada")
    print(f"  committed user {ada.user_id} (ada@example.com) with {len(ada.job_ids)} jobs:")
    show_jobs(app, ada.job_ids.values())
    jobs_after_signup = count_rows(engine, sqlqueue_jobs)

    heading("2. Ada's browser submits the form again (double-submit)")
    with engine.begin() as conn:
        again = sign_up(app, conn, email="ada@example.com", name="Ada")
    jobs_now = count_rows(engine, sqlqueue_jobs)
    print(f"  same user id: {again.user_id == ada.user_id}; same job ids: {again == ada}")
    print(f"  rows in sqlqueue_jobs: {jobs_after_signup} before, {jobs_now} after: nothing new")
    checks.expect(
        again == ada and jobs_now == jobs_after_signup, "a double-submit enqueues nothing"
    )

    heading("3. Bob signs up, but a later step fails and the transaction rolls back")
    bob_jobs: dict[str, int] = {}
    try:
        with engine.begin() as conn:
            bob = sign_up(app, conn, email="bob@example.com", name="Bob")
            bob_jobs = bob.job_ids
            print(f"  inside the transaction: user {bob.user_id} and {len(bob_jobs)} jobs written")
            raise SignupRejected("the payment profile could not be created")
    except SignupRejected as error:
        print(f"  sign-up rejected ({error}); the transaction rolled back")
    with engine.connect() as conn:
        bob_rows = conn.scalar(
            sa.select(sa.func.count()).select_from(users).where(users.c.email == "bob@example.com")
        )
    leftovers = [job_id for job_id in bob_jobs.values() if queue.get_job(job_id) is not None]
    print(f"  users named bob: {bob_rows}; Bob's jobs still in the queue: {len(leftovers)}")
    checks.expect(
        bob_rows == 0 and not leftovers, "a rolled-back sign-up leaves no user and no jobs"
    )
    checks.expect(
        count_rows(engine, sqlqueue_jobs) == jobs_after_signup, "the job count is unchanged"
    )

    heading("4. A worker runs Ada's jobs (the mail server is busy once, the CRM is down)")
    print("  welcome email: up to 3 attempts, retried after 0.5 s (SMTP 4xx and network errors)")
    print("  CRM webhook:   up to 3 attempts, retried after 0.3 s then 0.6 s (5xx, 408, 429 …)")
    run_workers_until_settled(app, ada.job_ids.values())
    show_jobs(app, ada.job_ids.values(), full=True)
    email_job = fetch(queue, ada.job_ids["email"])
    crm_job = fetch(queue, ada.job_ids["crm"])
    event_job = fetch(queue, ada.job_ids["analytics"])
    checks.expect(
        email_job.status == "succeeded" and email_job.attempts == 2 and len(email_job.errors) == 1,
        "the welcome email succeeded on its second attempt",
    )
    checks.expect(event_job.status == "succeeded" and event_job.attempts == 1, "analytics ran once")
    checks.expect(
        crm_job.status == "dead"
        and crm_job.attempts == 3
        and [record.details and record.details.get("status") for record in crm_job.errors]
        == [503, 503, 503],
        "the CRM webhook is dead after three 503s",
    )
    print(f"  the CRM answered: {[request.status for request in crm.requests]}")

    heading("5. The welcome email, as the mail server received it")
    result = email_job.result if isinstance(email_job.result, dict) else {}
    for message in mail.received:
        print(f"  Message-ID: {message['Message-ID']}")
        print(f"  To:         {message['To']}")
        print(f"  Subject:    {message['Subject']}")
    print(
        f"  the job's result: Message-ID {result.get('message_id')}, reply {result.get('reply')!r}"
    )
    checks.expect(
        len(mail.received) == 1
        and mail.received[0]["Message-ID"] == email_job.payload["message_id"]
        and result.get("message_id") == email_job.payload["message_id"]
        and mail.received[0]["Subject"] == "Welcome, Ada!",
        "one welcome email arrived, under the Message-ID the job recorded",
    )

    heading("6. The CRM is back; support finds the dead delivery and requeues it")
    crm.up = True
    listing = operator(database_url, "dead", "list", "--type", TASK_NAME)
    checks.expect(
        listing.returncode == 0 and f"\n{crm_job.id} " in listing.stdout,
        "`sqlqueue dead list` shows the dead delivery",
    )
    requeue = operator(
        database_url,
        *("dead", "requeue", "--type", TASK_NAME, "--by", SUPPORT, "--reason", REQUEUE_REASON),
    )
    dead = fetch(queue, crm_job.id)
    checks.expect(
        requeue.returncode == 0 and dead.requeued_as is not None,
        "`sqlqueue dead requeue` requeued the dead delivery",
    )
    if dead.requeued_as is None:
        return report(checks)
    new_id = dead.requeued_as
    run_workers_until_settled(app, [new_id])
    show_jobs(app, [dead.id, new_id], full=True)
    requeued = fetch(queue, new_id)
    checks.expect(
        requeued.status == "succeeded" and requeued.requeued_from == dead.id,
        "the requeued delivery succeeded",
    )
    checks.expect(
        dead.status == "dead"
        and (dead.requeued_by, dead.requeue_reason) == (SUPPORT, REQUEUE_REASON),
        "the dead row stays dead and records who requeued it and why",
    )
    webhook_id = crm_job.payload["message_id"]
    accepted = [request for request in crm.requests if request.status == 200]
    print(f"  the CRM answered: {[request.status for request in crm.requests]}")
    ids = sorted({request.webhook_id for request in crm.requests})
    print(f"  webhook-id of all {len(crm.requests)} requests: {', '.join(ids)}")
    for request in accepted:
        print(f"  signature verified with sqlqueue.webhooks.verify(); event: {request.event}")
    checks.expect(
        len(accepted) == 1
        and {request.webhook_id for request in crm.requests} == {webhook_id}
        and accepted[0].event["type"] == "user.created"
        and accepted[0].event["data"] == {"user_id": ada.user_id, "email": "ada@example.com"},
        "the CRM verified one user.created event, under the webhook-id of every attempt",
    )

    heading("7. Someone replays that request with a changed body: the signature no longer holds")
    original = accepted[0] if accepted else None
    status, refused = 0, None
    if original is not None:
        forged = original.body.replace(b'"ada@example.com"', b'"mallory@example.com"')
        status = post(crm.url, original.headers, forged)
        refused = crm.requests[-1].refused
        print(f"  same headers, email changed in the body: the CRM answered {status} ({refused})")
    checks.expect(
        status == 400 and refused is not None and crm.contacts == {ada.user_id: "ada@example.com"},
        "the CRM refuses a tampered copy and keeps one contact",
    )

    heading("Summary")
    show_jobs(app, [*ada.job_ids.values(), new_id])
    print(
        f"  app tables: {count_rows(engine, users)} user, "
        f"{count_rows(engine, analytics_events)} analytics event; "
        f"mail server: {len(mail.received)} message; CRM contacts: {crm.contacts}"
    )
    checks.expect(count_rows(engine, analytics_events) == 1, "one analytics event")
    return report(checks)


def report(checks: Checks) -> int:
    if checks.misses:
        print(f"\n{len(checks.misses)} check(s) failed: {checks.misses}")
        return 1
    print("\nall checks passed")
    return 0


def _worker_log_to_stdout() -> None:
    """Show the worker's retry and dead-letter messages as part of the story."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("     worker │ %(message)s"))
    log = logging.getLogger("sqlqueue")
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    log.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--database-url",
        default=os.environ.get(URL_VARIABLE),
        help=f"default: ${URL_VARIABLE}, else an SQLite file in the work directory",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="where the default SQLite file goes, kept at exit; default: a temporary "
        "directory, removed at exit",
    )
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    _worker_log_to_stdout()
    workdir: Path = args.workdir or Path(tempfile.mkdtemp(prefix="sqlqueue-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    url = args.database_url or f"sqlite:///{workdir / 'signup.db'}"
    engine = sa.create_engine(url)
    print(f"database: {engine.url.render_as_string(hide_password=True)}")
    started = time.monotonic()
    mail = MailServer()
    try:
        with running_mail_server(mail) as smtp_port, Crm() as crm:
            code = run_demo(engine, mail, smtp_port, crm)
        print(f"(took {time.monotonic() - started:.1f} s)")
        return code
    finally:
        engine.dispose()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
