"""A sign-up and its background jobs, end to end, on the database you already have.

Run it as it is (an SQLite file in a temporary directory)::

    python examples/signup_demo.py
    python examples/signup_demo.py --database-url postgresql+psycopg://user@host/db

What it shows, in order:

1. A sign-up writes the user row AND its three jobs (welcome email, CRM sync, analytics event)
   in ONE transaction; each job carries an idempotency key such as ``welcome_email:user:1``.
2. A double-submit of the same form enqueues nothing new: the keys return the existing jobs.
3. A sign-up whose transaction rolls back leaves neither a user nor a job behind.
4. A worker runs the jobs. The mail server answers "421 try again later" twice, so the welcome
   email retries on a short explicit backoff and then succeeds. The CRM is down, so its job
   runs out of attempts and ends ``dead``.
5. Running the email handler again (as after a crash between "sent" and "commit") sends nothing:
   the side effect is recorded under its key.
6. Support "fixes" the CRM and requeues the dead job with
   ``queue.requeue(job_id, by=..., reason=...)``: a NEW job runs and succeeds; the dead row
   keeps who, when and why.

The handlers do real local work: rows in the demo's own tables and ``.eml`` files in an outbox
directory. No network. The program checks what it claims and exits 1 if anything differs.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

import sqlqueue

URL_VARIABLE = "SQLQUEUE_DATABASE_URL"

# -- the application's own tables (SQLAlchemy Core) -------------------------------------------

app_metadata = sa.MetaData()

users = sa.Table(
    "demo_users",
    app_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("email", sa.String(255), nullable=False, unique=True),
    sa.Column("name", sa.String(255), nullable=False),
)

#: Welcome emails actually handed to the mail server, one per dedup key (effect-time dedup).
sent_emails = sa.Table(
    "demo_sent_emails",
    app_metadata,
    sa.Column("dedup_key", sa.String(255), primary_key=True),
    sa.Column("user_id", sa.Integer, nullable=False),
    sa.Column("message_id", sa.String(255), nullable=False),
    sa.Column("template", sa.String(100), nullable=False),
)

#: The contacts our pretend CRM knows about.
crm_contacts = sa.Table(
    "demo_crm_contacts",
    app_metadata,
    sa.Column("user_id", sa.Integer, primary_key=True),
    sa.Column("email", sa.String(255), nullable=False),
)

analytics_events = sa.Table(
    "demo_analytics_events",
    app_metadata,
    sa.Column("dedup_key", sa.String(255), primary_key=True),
    sa.Column("event", sa.String(100), nullable=False),
    sa.Column("user_id", sa.Integer, nullable=False),
)

sqlqueue_jobs = sa.table("sqlqueue_jobs", sa.column("id"))

# -- pretend external services ---------------------------------------------------------------


class TemporaryMailError(Exception):
    """The mail server said "try again later" (an SMTP 4xx): worth retrying."""


@dataclass
class FlakyMailServer:
    """Delivers into an outbox directory, but first answers 421 ``failures`` times."""

    outbox: Path
    failures: int = 2
    deliveries: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def send(self, *, message_id: str, to: str, subject: str, body: str) -> None:
        with self._lock:
            if self.failures > 0:
                self.failures -= 1
                raise TemporaryMailError("421 4.7.0 mail.example.test: too busy, try again later")
            self.deliveries += 1
        self.outbox.mkdir(parents=True, exist_ok=True)
        message = f"Message-ID: {message_id}\nTo: {to}\nSubject: {subject}\n\n{body}\n"
        (self.outbox / f"{message_id.strip('<>')}.eml").write_text(message, encoding="utf-8")


@dataclass
class PretendCrm:
    """A CRM that is down until someone fixes it."""

    up: bool = False

    def check(self) -> None:
        if not self.up:
            raise ConnectionError("crm.example.test:443: connection timed out after 10 s")


# -- the queue and its tasks -----------------------------------------------------------------


@dataclass
class App:
    """The demo application: its engine, queue, tasks and pretend services."""

    engine: sa.Engine
    queue: sqlqueue.Queue
    mail: FlakyMailServer
    crm: PretendCrm
    send_welcome_email: sqlqueue.Task
    sync_crm_contact: sqlqueue.Task
    track_signup: sqlqueue.Task


def build_app(engine: sa.Engine, outbox: Path) -> App:
    """Register the three tasks on a queue bound to ``engine``."""
    queue = sqlqueue.Queue(engine, lease_seconds=10.0)
    mail = FlakyMailServer(outbox=outbox)
    crm = PretendCrm()

    @queue.task(
        "send_welcome_email",
        queue="mail",
        max_attempts=5,
        backoff=sqlqueue.schedule([0.5, 1.0]),  # short on purpose; production: minutes
        retry_on=TemporaryMailError,  # anything else is a bug: dead at once
    )
    def send_welcome_email(user_id: int, template: str) -> None:
        key = f"welcome_email:user:{user_id}"
        with engine.connect() as conn:
            if conn.scalar(
                sa.select(sent_emails.c.dedup_key).where(sent_emails.c.dedup_key == key)
            ):
                print(f"    handler │ {key} is already recorded as sent: not sending it again")
                return
            user = conn.execute(sa.select(users).where(users.c.id == user_id)).one()
        message_id = f"<{key.replace(':', '.')}@signup-demo.example>"  # deterministic
        mail.send(
            message_id=message_id,
            to=user.email,
            subject=f"Welcome, {user.name}!",
            body=f"Hi {user.name}, thanks for signing up. (template {template})",
        )
        with engine.begin() as conn:
            conn.execute(
                sa.insert(sent_emails).values(
                    dedup_key=key, user_id=user_id, message_id=message_id, template=template
                )
            )

    @queue.task(
        "sync_crm_contact",
        queue="integrations",
        max_attempts=3,
        backoff=sqlqueue.schedule([0.3, 0.6]),
    )
    def sync_crm_contact(user_id: int) -> None:
        crm.check()
        with engine.begin() as conn:
            if conn.scalar(
                sa.select(crm_contacts.c.user_id).where(crm_contacts.c.user_id == user_id)
            ):
                return  # already synced by an earlier run
            email = conn.scalar(sa.select(users.c.email).where(users.c.id == user_id))
            conn.execute(sa.insert(crm_contacts).values(user_id=user_id, email=email))

    @queue.task("track_signup", queue="analytics")
    def track_signup(user_id: int) -> None:
        key = f"analytics:signup:user:{user_id}"
        with engine.begin() as conn:
            if conn.scalar(
                sa.select(analytics_events.c.dedup_key).where(analytics_events.c.dedup_key == key)
            ):
                return
            conn.execute(
                sa.insert(analytics_events).values(dedup_key=key, event="signup", user_id=user_id)
            )

    return App(
        engine=engine,
        queue=queue,
        mail=mail,
        crm=crm,
        send_welcome_email=send_welcome_email,
        sync_crm_contact=sync_crm_contact,
        track_signup=track_signup,
    )


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
    transaction: both commit together or neither does."""
    user_id = conn.scalar(sa.select(users.c.id).where(users.c.email == email))
    if user_id is None:
        user_id = conn.execute(
            sa.insert(users).values(email=email, name=name).returning(users.c.id)
        ).scalar_one()
    job_ids = {
        "send_welcome_email": app.send_welcome_email.options(
            idempotency_key=f"welcome_email:user:{user_id}"
        ).enqueue(conn, user_id=user_id, template="welcome-v3"),
        "sync_crm_contact": app.sync_crm_contact.options(
            idempotency_key=f"crm_sync:user:{user_id}"
        ).enqueue(conn, user_id=user_id),
        "track_signup": app.track_signup.options(
            idempotency_key=f"analytics:signup:user:{user_id}"
        ).enqueue(conn, user_id=user_id),
    }
    return Signup(user_id=user_id, job_ids=job_ids)


# -- running workers -------------------------------------------------------------------------

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


# -- printing --------------------------------------------------------------------------------


def heading(text: str) -> None:
    print(f"\n== {text}")


def describe(job: sqlqueue.Job) -> str:
    attempts = f"{job.attempts}/{job.max_attempts}"
    line = f"job {job.id:<3} {job.job_type:<19} {job.status.value:<9} attempts {attempts}"
    if job.idempotency_key:
        line += f"  key {job.idempotency_key}"
    if job.requeued_from is not None:
        line += f"  (requeued from job {job.requeued_from})"
    return line


def describe_in_full(job: sqlqueue.Job) -> list[str]:
    lines = [describe(job)]
    if job.last_error:
        lines.append(f"    last error: {job.last_error}")
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


class Checks:
    """What the narrative claims, checked; any miss makes the program exit 1."""

    def __init__(self) -> None:
        self.misses: list[str] = []

    def expect(self, condition: bool, claim: str) -> None:
        if not condition:
            self.misses.append(claim)
            print(f"  !! UNEXPECTED: {claim} does not hold")


# -- the story -------------------------------------------------------------------------------


def run_demo(engine: sa.Engine, outbox: Path) -> int:
    checks = Checks()
    sqlqueue.migrate(engine)
    app_metadata.create_all(engine)
    if count_rows(engine, users) or count_rows(engine, sqlqueue_jobs):
        print("this database already has demo users or jobs; point --database-url at a new one")
        return 2
    app = build_app(engine, outbox)
    queue = app.queue

    heading("1. Ada signs up: the user row and its jobs are written in ONE transaction")
    with engine.begin() as conn:
        ada = sign_up(app, conn, email="ada@example.test", name="Ada")
    print(f"  committed user {ada.user_id} (ada@example.test) with {len(ada.job_ids)} jobs:")
    show_jobs(app, ada.job_ids.values())
    jobs_after_signup = count_rows(engine, sqlqueue_jobs)

    heading("2. Ada's browser submits the form again (double-submit)")
    with engine.begin() as conn:
        again = sign_up(app, conn, email="ada@example.test", name="Ada")
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
            bob = sign_up(app, conn, email="bob@example.test", name="Bob")
            bob_jobs = bob.job_ids
            print(f"  inside the transaction: user {bob.user_id} and {len(bob_jobs)} jobs written")
            raise SignupRejected("the payment profile could not be created")
    except SignupRejected as error:
        print(f"  sign-up rejected ({error}); the transaction rolled back")
    with engine.connect() as conn:
        bob_rows = conn.scalar(
            sa.select(sa.func.count()).select_from(users).where(users.c.email == "bob@example.test")
        )
    leftovers = [job_id for job_id in bob_jobs.values() if queue.get_job(job_id) is not None]
    print(f"  users named bob: {bob_rows}; Bob's jobs still in the queue: {len(leftovers)}")
    checks.expect(
        bob_rows == 0 and not leftovers, "a rolled-back sign-up leaves no user and no jobs"
    )
    checks.expect(
        count_rows(engine, sqlqueue_jobs) == jobs_after_signup, "the job count is unchanged"
    )

    heading("4. A worker runs Ada's jobs (the mail server is flaky, the CRM is down)")
    print("  welcome email: up to 5 attempts, retried after 0.5 s then 1 s, only on 421s")
    print("  CRM sync:      up to 3 attempts, retried after 0.3 s then 0.6 s")
    run_workers_until_settled(app, ada.job_ids.values())
    show_jobs(app, ada.job_ids.values(), full=True)
    email_job = fetch(queue, ada.job_ids["send_welcome_email"])
    crm_job = fetch(queue, ada.job_ids["sync_crm_contact"])
    event_job = fetch(queue, ada.job_ids["track_signup"])
    checks.expect(
        email_job.status == "succeeded" and email_job.attempts == 3 and len(email_job.errors) == 2,
        "the welcome email succeeded on its third attempt",
    )
    checks.expect(event_job.status == "succeeded" and event_job.attempts == 1, "analytics ran once")
    checks.expect(
        crm_job.status == "dead" and crm_job.attempts == 3 and len(crm_job.errors) == 3,
        "the CRM sync is dead after 3 attempts",
    )

    heading("5. The email job runs again (as after a crash between sending and committing)")
    app.send_welcome_email(user_id=ada.user_id, template="welcome-v3")
    emails = sorted(path.name for path in outbox.glob("*.eml"))
    print(f"  outbox: {emails}; mail server deliveries: {app.mail.deliveries}")
    checks.expect(len(emails) == 1 and app.mail.deliveries == 1, "exactly one welcome email")

    heading("6. Next morning: support sees the dead job, the CRM is fixed, the job is requeued")
    app.crm.up = True
    new_id = queue.requeue(crm_job.id, by="support@example.test", reason="CRM is back up")
    print(f"  requeued dead job {crm_job.id} as new job {new_id}")
    run_workers_until_settled(app, [new_id])
    show_jobs(app, [crm_job.id, new_id], full=True)
    requeued = fetch(queue, new_id)
    dead = fetch(queue, crm_job.id)
    checks.expect(
        requeued.status == "succeeded" and requeued.requeued_from == crm_job.id,
        "the requeued job succeeded",
    )
    checks.expect(
        dead.status == "dead" and dead.requeued_as == new_id and dead.requeued_by is not None,
        "the dead row stays dead and records who requeued it",
    )

    heading("Summary")
    everything = [*ada.job_ids.values(), new_id]
    show_jobs(app, everything)
    print(
        f"  app tables: {count_rows(engine, users)} user, {count_rows(engine, sent_emails)} "
        f"welcome email sent, {count_rows(engine, crm_contacts)} CRM contact, "
        f"{count_rows(engine, analytics_events)} analytics event"
    )
    checks.expect(
        (count_rows(engine, crm_contacts), count_rows(engine, analytics_events)) == (1, 1),
        "one CRM contact and one analytics event",
    )
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
        help="where the outbox (and the default SQLite file) go; default: a temporary "
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
    try:
        return run_demo(engine, workdir / "outbox")
    finally:
        engine.dispose()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
