"""What the fault tests count from: tables written by the handlers, the worker hooks and triggers.

- ``fault_ledger``: one row per handler execution ``(job_id, attempt, pid, started, finished)``,
  appended in its own autocommitted transaction, so a crash never takes it back. ``clock`` is
  what the worker process believed the time was (it differs from ``started`` only when the
  clock-skew hook is on). Times are true epoch seconds (:func:`wall_clock`).
- ``fault_claims``: one row per non-empty claim when the claim-recording hook is on.
- ``fault_events``: faults a worker hook injected (a connection killed before a commit, …).
- ``fault_transitions``: an audit trigger on ``sqlqueue_jobs`` records every change of status,
  attempt count or owner, with the database's time. It is how the tests see "exactly-once
  state transitions" (a job never leaves ``succeeded``, never has two owners at once).
- ``fault_leases`` (only for the tests that ask, :func:`create_lease_audit`): a second trigger
  records every change of a job's lease (a claim, a heartbeat, a reap, an outcome) with the
  old and the new expiry and the changing statement's own database time, the clock sqlqueue
  compares leases with. It is how the tests see "reaped only once the lease had expired" and
  "the heartbeat extended the lease" without trusting what the worker says.

Times are DOUBLE (MySQL's FLOAT is single precision). The triggers and ``fault_pause`` (the
claim-window widener, see ``fault_hooks``) differ per backend; they are test instruments, kept
here as DDL that runs only on its own dialect.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa

from sqlqueue.dialects import dialect_for
from tests.apps.fault_clock import wall_clock

__all__ = [
    "Execution",
    "LeaseChange",
    "Transition",
    "create_fault_tables",
    "create_lease_audit",
    "ledger_engine",
    "read_claims",
    "read_events",
    "read_lease_changes",
    "read_ledger",
    "read_transitions",
    "record_event",
    "record_finish",
    "record_start",
]

_metadata = sa.MetaData()

LEDGER = sa.Table(
    "fault_ledger",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("attempt", sa.Integer, nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("started", sa.Double, nullable=False),
    sa.Column("finished", sa.Double, nullable=True),
    sa.Column("clock", sa.Double, nullable=False),
)

CLAIMS = sa.Table(
    "fault_claims",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("claim_limit", sa.Integer, nullable=False),
    sa.Column("returned", sa.Integer, nullable=False),
    sa.Column("at", sa.Double, nullable=False),
)

EVENTS = sa.Table(
    "fault_events",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("job_id", sa.BigInteger, nullable=True),
    sa.Column("kind", sa.String(50), nullable=False),
    sa.Column("at", sa.Double, nullable=False),
)

TRANSITIONS = sa.Table(
    "fault_transitions",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("old_status", sa.String(16), nullable=True),
    sa.Column("new_status", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("locked_by", sa.String(255), nullable=True),
    sa.Column("at", sa.Double, nullable=False),
)

_AUDITED_CHANGE = (
    "OLD.status IS NOT NEW.status OR OLD.attempts IS NOT NEW.attempts "
    "OR OLD.locked_by IS NOT NEW.locked_by"
)
_SQLITE_AUDIT = f"""
CREATE TRIGGER fault_audit AFTER UPDATE ON sqlqueue_jobs
WHEN {_AUDITED_CHANGE}
BEGIN
    INSERT INTO fault_transitions (job_id, old_status, new_status, attempts, locked_by, at)
    VALUES (NEW.id, OLD.status, NEW.status, NEW.attempts, NEW.locked_by,
            (julianday('now') - 2440587.5) * 86400.0);
END
"""
_POSTGRES_AUDIT_FUNCTION = f"""
CREATE OR REPLACE FUNCTION fault_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF {_AUDITED_CHANGE.replace("IS NOT", "IS DISTINCT FROM")} THEN
        INSERT INTO fault_transitions (job_id, old_status, new_status, attempts, locked_by, at)
        VALUES (NEW.id, OLD.status, NEW.status, NEW.attempts, NEW.locked_by,
                extract(epoch FROM clock_timestamp()));
    END IF;
    RETURN NULL;
END $$
"""
_POSTGRES_AUDIT_TRIGGER = """
CREATE TRIGGER fault_audit AFTER UPDATE ON sqlqueue_jobs
FOR EACH ROW EXECUTE FUNCTION fault_audit()
"""
#: The claim-window widener on PostgreSQL (SQLite workers register a Python function).
_POSTGRES_PAUSE = """
CREATE OR REPLACE FUNCTION fault_pause(seconds double precision) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$ BEGIN PERFORM pg_sleep(seconds); RETURN true; END $$
"""

_MYSQL_AUDIT = """
CREATE TRIGGER fault_audit AFTER UPDATE ON sqlqueue_jobs FOR EACH ROW
BEGIN
    IF NOT (OLD.status <=> NEW.status) OR NOT (OLD.attempts <=> NEW.attempts)
            OR NOT (OLD.locked_by <=> NEW.locked_by) THEN
        INSERT INTO fault_transitions (job_id, old_status, new_status, attempts, locked_by, at)
        VALUES (NEW.id, OLD.status, NEW.status, NEW.attempts, NEW.locked_by,
                UNIX_TIMESTAMP(SYSDATE(6)));
    END IF;
END
"""
_MYSQL_PAUSE = """
CREATE FUNCTION fault_pause(seconds DOUBLE) RETURNS BOOLEAN NOT DETERMINISTIC NO SQL
BEGIN
    DO SLEEP(seconds);
    RETURN TRUE;
END
"""

_MYSQL_DDL = (_MYSQL_AUDIT, "DROP FUNCTION IF EXISTS fault_pause", _MYSQL_PAUSE)

for _ddl, _dialect in (
    (_SQLITE_AUDIT, "sqlite"),
    (_POSTGRES_AUDIT_FUNCTION, "postgresql"),
    (_POSTGRES_AUDIT_TRIGGER, "postgresql"),
    (_POSTGRES_PAUSE, "postgresql"),
    *((ddl, name) for name in ("mysql", "mariadb") for ddl in _MYSQL_DDL),
):
    sa.event.listen(
        TRANSITIONS, "after_create", sa.DDL(_ddl.replace("%", "%%")).execute_if(dialect=_dialect)
    )


def create_fault_tables(engine: sa.Engine) -> None:
    """Create the ledger, claim, event and audit tables (after sqlqueue's migrations)."""
    _metadata.create_all(engine)


_lease_metadata = sa.MetaData()

LEASES = sa.Table(
    "fault_leases",
    _lease_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.BigInteger, nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("locked_by", sa.String(255), nullable=True),
    sa.Column("old_status", sa.String(16), nullable=True),
    sa.Column("new_status", sa.String(16), nullable=False),
    sa.Column("old_lease", sa.Double, nullable=True),
    sa.Column("new_lease", sa.Double, nullable=True),
    sa.Column("at", sa.Double, nullable=False),
)

_LEASE_COLUMNS = "job_id, attempts, locked_by, old_status, new_status, old_lease, new_lease, at"
#: Epoch seconds of a lease column or clock, per backend. ``at`` is the clock sqlqueue's own
#: statements read (SQLite's ``'now'`` and MariaDB's ``UTC_TIMESTAMP(6)`` are fixed for the
#: statement, triggers included; PostgreSQL's ``statement_timestamp()``), so a reap's ``at``
#: is the very "now" its fence compared the lease with.
_SQLITE_EPOCH = "(julianday({}) - 2440587.5) * 86400.0"
_MYSQL_EPOCH = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', {}) / 1000000"
_SQLITE_LEASE_AUDIT = f"""
CREATE TRIGGER fault_lease_audit AFTER UPDATE ON sqlqueue_jobs
WHEN OLD.lease_expires_at IS NOT NEW.lease_expires_at
BEGIN
    INSERT INTO fault_leases ({_LEASE_COLUMNS})
    VALUES (NEW.id, NEW.attempts, NEW.locked_by, OLD.status, NEW.status,
            {_SQLITE_EPOCH.format("OLD.lease_expires_at")},
            {_SQLITE_EPOCH.format("NEW.lease_expires_at")},
            {_SQLITE_EPOCH.format("'now'")});
END
"""
_POSTGRES_LEASE_AUDIT_FUNCTION = f"""
CREATE OR REPLACE FUNCTION fault_lease_audit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.lease_expires_at IS DISTINCT FROM NEW.lease_expires_at THEN
        INSERT INTO fault_leases ({_LEASE_COLUMNS})
        VALUES (NEW.id, NEW.attempts, NEW.locked_by, OLD.status, NEW.status,
                extract(epoch FROM OLD.lease_expires_at),
                extract(epoch FROM NEW.lease_expires_at),
                extract(epoch FROM statement_timestamp()));
    END IF;
    RETURN NULL;
END $$
"""
_POSTGRES_LEASE_AUDIT_TRIGGER = """
CREATE TRIGGER fault_lease_audit AFTER UPDATE ON sqlqueue_jobs
FOR EACH ROW EXECUTE FUNCTION fault_lease_audit()
"""
_MYSQL_LEASE_AUDIT = f"""
CREATE TRIGGER fault_lease_audit AFTER UPDATE ON sqlqueue_jobs FOR EACH ROW
BEGIN
    IF NOT (OLD.lease_expires_at <=> NEW.lease_expires_at) THEN
        INSERT INTO fault_leases ({_LEASE_COLUMNS})
        VALUES (NEW.id, NEW.attempts, NEW.locked_by, OLD.status, NEW.status,
                {_MYSQL_EPOCH.format("OLD.lease_expires_at")},
                {_MYSQL_EPOCH.format("NEW.lease_expires_at")},
                {_MYSQL_EPOCH.format("UTC_TIMESTAMP(6)")});
    END IF;
END
"""

for _ddl, _dialect in (
    (_SQLITE_LEASE_AUDIT, "sqlite"),
    (_POSTGRES_LEASE_AUDIT_FUNCTION, "postgresql"),
    (_POSTGRES_LEASE_AUDIT_TRIGGER, "postgresql"),
    (_MYSQL_LEASE_AUDIT, "mysql"),
    (_MYSQL_LEASE_AUDIT, "mariadb"),
):
    sa.event.listen(
        LEASES, "after_create", sa.DDL(_ddl.replace("%", "%%")).execute_if(dialect=_dialect)
    )


def create_lease_audit(engine: sa.Engine) -> None:
    """Create ``fault_leases`` and its trigger (after sqlqueue's migrations)."""
    _lease_metadata.create_all(engine)


@functools.cache
def ledger_engine() -> sa.Engine:
    """This process's engine for ledger writes: ``FAULT_LEDGER_URL``, else the queue's URL.

    Its own pool, so a fault aimed at the worker's connections never hits the ledger; a small
    one (3 connections at most), so 16 worker processes fit PostgreSQL's default 100. Times
    are read before a connection is taken, so waiting for one does not skew them.
    """
    url = os.environ.get("FAULT_LEDGER_URL") or os.environ["SQLQUEUE_DATABASE_URL"]
    engine = sa.create_engine(url, pool_pre_ping=True, pool_size=2, max_overflow=1)
    dialect_for(engine).prepare_engine(engine)  # on SQLite: WAL and a busy timeout
    return engine


def record_start(job_id: int, attempt: int, *, finished: bool = False) -> int:
    """Append this execution's ledger row; return its id."""
    now = wall_clock()
    stmt = (
        LEDGER.insert()
        .values(
            job_id=job_id,
            attempt=attempt,
            pid=os.getpid(),
            started=now,
            finished=now if finished else None,
            clock=time.time(),  # the process's own idea of the time (skewed or not)
        )
        .returning(LEDGER.c.id)
    )
    with ledger_engine().begin() as conn:
        return int(conn.execute(stmt).scalar_one())


def record_finish(ledger_id: int) -> None:
    """Mark a ledger row's execution finished."""
    stmt = LEDGER.update().where(LEDGER.c.id == ledger_id).values(finished=wall_clock())
    with ledger_engine().begin() as conn:
        conn.execute(stmt)


def record_event(kind: str, job_id: int | None = None) -> None:
    """Note a fault a hook injected in this process."""
    stmt = EVENTS.insert().values(pid=os.getpid(), job_id=job_id, kind=kind, at=wall_clock())
    with ledger_engine().begin() as conn:
        conn.execute(stmt)


def record_claim(limit: int, returned: int) -> None:
    """Note one claim's limit and how many jobs it returned."""
    stmt = CLAIMS.insert().values(
        pid=os.getpid(), claim_limit=limit, returned=returned, at=wall_clock()
    )
    with ledger_engine().begin() as conn:
        conn.execute(stmt)


# -- reading (the test's side) -----------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Execution:
    """One handler execution from the ledger."""

    job_id: int
    attempt: int
    pid: int
    started: float
    finished: float | None
    clock: float


@dataclass(frozen=True, kw_only=True)
class Transition:
    """One audited change of a job row."""

    job_id: int
    old_status: str | None
    new_status: str
    attempts: int
    locked_by: str | None
    at: float


@dataclass(frozen=True, kw_only=True)
class LeaseChange:
    """One audited change of a job's lease: times are epoch seconds of the database clock."""

    job_id: int
    attempts: int
    locked_by: str | None
    old_status: str | None
    new_status: str
    #: The expiry before and after the change (``None``: no lease).
    old_lease: float | None
    new_lease: float | None
    #: The database's "now" of the statement that made the change.
    at: float


def read_ledger(engine: sa.Engine) -> list[Execution]:
    """Every execution, in the order they started."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(LEDGER).order_by(LEDGER.c.id)).mappings().all()
    return [
        Execution(
            job_id=row["job_id"],
            attempt=row["attempt"],
            pid=row["pid"],
            started=row["started"],
            finished=row["finished"],
            clock=row["clock"],
        )
        for row in rows
    ]


def read_transitions(engine: sa.Engine) -> list[Transition]:
    """Every audited job-row change, in commit order per job."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(TRANSITIONS).order_by(TRANSITIONS.c.id)).mappings().all()
    return [
        Transition(
            job_id=row["job_id"],
            old_status=row["old_status"],
            new_status=row["new_status"],
            attempts=row["attempts"],
            locked_by=row["locked_by"],
            at=float(row["at"]),
        )
        for row in rows
    ]


def read_lease_changes(engine: sa.Engine) -> list[LeaseChange]:
    """Every audited lease change, in commit order per job."""
    with engine.connect() as conn:
        rows = conn.execute(sa.select(LEASES).order_by(LEASES.c.id)).mappings().all()
    return [
        LeaseChange(
            job_id=row["job_id"],
            attempts=row["attempts"],
            locked_by=row["locked_by"],
            old_status=row["old_status"],
            new_status=row["new_status"],
            old_lease=None if row["old_lease"] is None else float(row["old_lease"]),
            new_lease=None if row["new_lease"] is None else float(row["new_lease"]),
            at=float(row["at"]),
        )
        for row in rows
    ]


def read_claims(engine: sa.Engine) -> Sequence[sa.RowMapping]:
    """Every recorded non-empty claim: ``pid, claim_limit, returned, at``."""
    with engine.connect() as conn:
        return conn.execute(sa.select(CLAIMS).order_by(CLAIMS.c.id)).mappings().all()


def read_events(engine: sa.Engine) -> Sequence[sa.RowMapping]:
    """Every recorded injected fault: ``pid, job_id, kind, at``."""
    with engine.connect() as conn:
        return conn.execute(sa.select(EVENTS).order_by(EVENTS.c.id)).mappings().all()
