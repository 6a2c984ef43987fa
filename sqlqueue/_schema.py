"""The tables of sqlqueue, declared once in SQLAlchemy Core: the single source of truth.

Migrations in ``migrations/`` must produce exactly this schema (a test compares them).
:data:`JOB_COLUMNS` says, once, which job columns an enqueue writes and a claim returns; every
INSERT, COPY, bulk statement and claim derives its column list from it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    event,
    func,
    literal_column,
    text,
)

from sqlqueue._types import MYSQL_NAMES, Id, JsonDocument, Number, UtcDateTime, exact_text

__all__ = [
    "CLAIM_COLUMNS",
    "ENQUEUE_COLUMNS",
    "HISTORY_DIALECTS",
    "JOB_COLUMNS",
    "ROW_COLUMNS",
    "SCHEMA_REVISION",
    "VERSION_TABLE",
    "ColumnKind",
    "Fill",
    "JobColumn",
    "batches",
    "circuit_breakers",
    "count_marks",
    "duties",
    "email_sent",
    "error_counts",
    "finished_counts",
    "history_metadata",
    "job_actions",
    "job_tags",
    "jobs",
    "jobs_history",
    "limit_keys",
    "metadata",
    "queues",
    "rate_limits",
    "table_options",
    "unique_keys",
    "webhook_endpoints",
    "workers",
    "workflow_edges",
    "workflow_steps",
]

#: Alembic's version table for sqlqueue's own revisions, apart from the host app's.
VERSION_TABLE = "sqlqueue_alembic_version"

#: The newest revision in ``migrations/``: the schema this code reads and writes (a test checks
#: it against alembic's head, so reading it costs no alembic import).
SCHEMA_REVISION = "0024"


def table_options(schema: str | None) -> dict[str, Any]:
    """Execution options that run a statement on these tables as they are in ``schema``: the
    tables are declared without one, and SQLAlchemy's ``schema_translate_map`` qualifies them
    as each statement is sent. No options (the connection's default schema) for ``None``.

    Only sqlqueue's own statements carry them, never a connection a caller lends: the map
    would move the caller's unqualified tables into ``schema`` as well.
    """
    return {} if schema is None else {"schema_translate_map": {None: schema}}


metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "pk": "pk_%(table_name)s",
    }
)

#: MariaDB and MySQL: full Unicode, and text keys (idempotency keys, queue names) compared byte
#: for byte as on the other backends, not case-insensitively as their default collation would.
#: The tables are created so; migration 0022 then moves them to the server's NO PAD binary
#: collation (``utf8mb4_bin`` pads: ``'mail' = 'mail '``), which has no one name on both.
_MYSQL_TABLE: dict[str, Any] = {"mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}

_STATUSES = "('queued', 'running', 'succeeded', 'failed', 'dead', 'cancelled', 'waiting')"
_CLAIMABLE = text("status IN ('queued', 'failed')")
# The plain claim's rows: claimable jobs of tasks without a concurrency limit (0013). Jobs of
# limited tasks have an index of their own, so blocked ones never sit in the plain claim's way.
_CLAIMABLE_UNLIMITED = text("status IN ('queued', 'failed') AND limit_key IS NULL")
_CLAIMABLE_LIMITED = text("status IN ('queued', 'failed') AND limit_key IS NOT NULL")

jobs = Table(
    "sqlqueue_jobs",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    # What to do.
    Column("job_type", String(200), nullable=False),
    Column("queue", String(100), nullable=False),
    Column("priority", Integer, nullable=False),
    Column("payload", JsonDocument, nullable=False),
    # When to try again.
    Column("status", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("next_run_at", UtcDateTime, nullable=False),
    # What happened last time.
    Column("last_error", Text, nullable=True),
    Column("errors", JsonDocument, nullable=False),
    Column("started_at", UtcDateTime, nullable=True),
    Column("finished_at", UtcDateTime, nullable=True),
    # Bookkeeping.
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    # Compared exactly on every backend: "k" and "k " are two keys (0011, MariaDB/MySQL).
    Column("idempotency_key", exact_text(255), nullable=True),
    Column("locked_by", String(255), nullable=True),
    Column("lease_expires_at", UtcDateTime, nullable=True),
    # Dead-letter requeue: the dead row keeps who/when/why and links to the new job.
    Column("requeued_from", Id, nullable=True),
    Column("requeued_as", Id, nullable=True),
    Column("requeued_at", UtcDateTime, nullable=True),
    Column("requeued_by", String(255), nullable=True),
    Column("requeue_reason", Text, nullable=True),
    # What the handler produced, and how far it got while running (added by 0002; columns
    # are declared in the order the migrations create them).
    Column("result", JsonDocument, nullable=True),
    Column("progress", JsonDocument, nullable=True),
    # Flow control (added by 0003): per-key ordering, and a stop request for a running job.
    Column("group_key", String(255), nullable=True),
    Column("cancel_requested_at", UtcDateTime, nullable=True),
    # Operations (added by 0005): a dead job a person marked handled without running it.
    Column("discarded_at", UtcDateTime, nullable=True),
    Column("discarded_by", String(255), nullable=True),
    Column("discard_reason", Text, nullable=True),
    # Tracing (added by 0008): the W3C trace context of the enqueuing code, as a JSON carrier
    # ``{"traceparent": …, "tracestate": …}``; NULL when it ran in no trace (or without
    # OpenTelemetry). Each attempt's consumer span continues that trace (sqlqueue/_tracing.py).
    Column("trace_context", Text, nullable=True),
    # Batches (added by 0009): the batch a child belongs to, or that a callback job completes.
    Column("batch_id", Id, nullable=True),
    # Concurrency limits (added by 0013): the key a limited task's job runs under ("" when the
    # limit covers the whole task); NULL for jobs of unlimited tasks.
    Column("limit_key", exact_text(255), nullable=True),
    # Unique jobs (added by 0015): the SHA-256 hex digest of the task, the ``Unique.by`` values
    # and the period bucket (see sqlqueue/_unique.py); NULL for a job that is not unique.
    Column("unique_key", String(64), nullable=True),
    # Expiry (added by 0015): a job not (re)started by then is cancelled, never run late.
    Column("expires_at", UtcDateTime, nullable=True),
    CheckConstraint(f"status IN {_STATUSES}", name="status"),
    CheckConstraint("max_attempts >= 1", name="max_attempts"),
    CheckConstraint("attempts >= 0 AND attempts <= max_attempts", name="attempts"),
    **_MYSQL_TABLE,
)


class ColumnKind(enum.Enum):
    """How a job column's value travels: as it is, as JSON text, or as a timestamp."""

    PLAIN = "plain"
    #: A JSON document, read back decoded.
    JSON = "json"
    #: A JSON array read back as a tuple; an empty one (``[]``, or ``null``) is not decoded.
    JSON_LIST = "json_list"
    #: A UTC timestamp; a claim's are never NULL.
    TIMESTAMP = "timestamp"


class Fill(enum.Enum):
    """Where an enqueue takes a job column's value from."""

    #: The checked job row (``sqlqueue._jobrow.JobRow``), under the column's name.
    ROW = "row"
    #: The column's ``constant`` (JSON columns: already encoded as text).
    CONSTANT = "constant"
    #: The database clock at the insert.
    CLOCK = "clock"
    #: The row's ``_run_at``, else the clock plus its ``_delay`` seconds.
    DUE = "due"


@dataclass(frozen=True)
class JobColumn:
    """One column of ``sqlqueue_jobs`` as enqueue and claim see it."""

    name: str
    kind: ColumnKind = ColumnKind.PLAIN
    #: How an enqueue writes it; ``None``: it does not (the database default, or NULL).
    fill: Fill | None = None
    constant: Any = None
    #: Whether a claim returns it, and under which ``ClaimedJob`` field (default: its name).
    claimed: bool = False
    claimed_as: str | None = None

    @property
    def field(self) -> str:
        """The ``ClaimedJob`` field a claim reads this column into."""
        return self.claimed_as or self.name


_PLAIN, _JSON, _TIME = ColumnKind.PLAIN, ColumnKind.JSON, ColumnKind.TIMESTAMP

#: The job columns enqueue and claim touch. Enqueue writes the ``fill`` ones, a claim returns
#: the ``claimed`` ones in this order, and the bulk paths carry the ``ROW`` ones in this order.
#: Adding a column is an entry here, its ``Column`` in ``jobs`` and a migration.
JOB_COLUMNS: tuple[JobColumn, ...] = (
    JobColumn("id", claimed=True),
    JobColumn("job_type", fill=Fill.ROW, claimed=True),
    JobColumn("queue", fill=Fill.ROW, claimed=True),
    JobColumn("priority", fill=Fill.ROW, claimed=True),
    JobColumn("payload", _JSON, fill=Fill.ROW, claimed=True),
    JobColumn("status", fill=Fill.CONSTANT, constant="queued"),
    JobColumn("attempts", fill=Fill.CONSTANT, constant=0, claimed=True, claimed_as="attempt"),
    JobColumn("max_attempts", fill=Fill.ROW, claimed=True),
    JobColumn("errors", ColumnKind.JSON_LIST, fill=Fill.CONSTANT, constant="[]", claimed=True),
    JobColumn("next_run_at", _TIME, fill=Fill.DUE, claimed=True),
    JobColumn("created_at", _TIME, fill=Fill.CLOCK, claimed=True),
    JobColumn("updated_at", _TIME, fill=Fill.CLOCK),
    JobColumn("idempotency_key", fill=Fill.ROW),
    JobColumn("group_key", fill=Fill.ROW),
    JobColumn("trace_context", fill=Fill.ROW, claimed=True),
    JobColumn("batch_id", fill=Fill.ROW, claimed=True),
    JobColumn("limit_key", fill=Fill.ROW),
    JobColumn("unique_key", fill=Fill.ROW),
    JobColumn("expires_at", fill=Fill.ROW),
    JobColumn("started_at", _TIME, claimed=True),
    JobColumn("lease_expires_at", _TIME, claimed=True),
)
#: The columns an enqueue writes, those it takes from the job row, and those a claim returns.
ENQUEUE_COLUMNS: tuple[JobColumn, ...] = tuple(c for c in JOB_COLUMNS if c.fill is not None)
ROW_COLUMNS: tuple[JobColumn, ...] = tuple(c for c in JOB_COLUMNS if c.fill is Fill.ROW)
CLAIM_COLUMNS: tuple[JobColumn, ...] = tuple(c for c in JOB_COLUMNS if c.claimed)

# Claim: due jobs of a queue in (priority, due time, id) order; only claimable rows of tasks
# without a concurrency limit are indexed (0013: with limit_key IS NULL).
Index(
    "ix_sqlqueue_jobs_claim",
    jobs.c.queue,
    jobs.c.priority,
    jobs.c.next_run_at,
    jobs.c.id,
    postgresql_where=_CLAIMABLE_UNLIMITED,
    sqlite_where=_CLAIMABLE_UNLIMITED,
)
# SQLite only (0023): the same rows by job type after the queue. A worker claims only the types
# it has tasks for, and SQLite walked the claim index above past every due job of a type no
# worker knew (behind 20,000 of them a claim took 6 to 8 times as long as on an empty queue):
# its claim reads each (queue, type) pair in claim order and stops at its limit
# (dialects/_claiming_by_type.py).
# PostgreSQL and MariaDB/MySQL pick ix_sqlqueue_jobs_status from their statistics instead.
Index(
    "ix_sqlqueue_jobs_claim_by_type",
    jobs.c.queue,
    jobs.c.job_type,
    jobs.c.priority,
    jobs.c.next_run_at,
    jobs.c.id,
    sqlite_where=_CLAIMABLE_UNLIMITED,
).ddl_if(dialect=("sqlite",))  # type: ignore[arg-type]  # a tuple is documented
# MariaDB/MySQL have no partial indexes, so there the claim index above holds every finished job
# too, and a claim walked the whole history of its queue (176 ms per claim at 100,000 finished
# jobs). This one (MySQL only) puts the status after the queue: the claim reads each claimable
# status in claim order and stops at its limit (see sqlqueue/dialects/mysql.py).
Index(
    "ix_sqlqueue_jobs_claim_by_status",
    jobs.c.queue,
    jobs.c.status,
    jobs.c.limit_key,  # 0013: the plain claim reads the NULL ones, in claim order
    jobs.c.priority,
    jobs.c.next_run_at,
    jobs.c.id,
).ddl_if(dialect=MYSQL_NAMES)  # type: ignore[arg-type]  # a tuple is documented
# Reaper: running jobs by lease expiry.
Index(
    "ix_sqlqueue_jobs_lease",
    jobs.c.lease_expires_at,
    postgresql_where=text("status = 'running'"),
    sqlite_where=text("status = 'running'"),
)
# Idempotency: enforced by the database, not by check-then-insert. NULL keys never collide.
Index("uq_sqlqueue_jobs_idempotency_key", jobs.c.idempotency_key, unique=True)
# Unique jobs (0015): the jobs holding a unique key, by status (not unique: the states that block
# vary per task, so the store looks them up under a lock on the key's row in
# ``sqlqueue_unique_keys``; a job leaving those states frees the key with no write of its own).
_UNIQUE = text("unique_key IS NOT NULL")
Index(
    "ix_sqlqueue_jobs_unique_key",
    jobs.c.unique_key,
    jobs.c.status,
    postgresql_where=_UNIQUE,
    sqlite_where=_UNIQUE,
)
# Expiry (0015): waiting jobs with an expiry, by it, for the upkeep that cancels expired ones.
_EXPIRING = text("expires_at IS NOT NULL")
Index(
    "ix_sqlqueue_jobs_expires",
    jobs.c.expires_at,
    jobs.c.status,
    postgresql_where=_EXPIRING,
    sqlite_where=_EXPIRING,
)
# Per-key ordering: the unfinished jobs of a group, oldest first. Only jobs with a group key
# (0024): a plain job's status change writes no entry here.
_GROUPED_UNFINISHED = text("status IN ('queued', 'failed', 'running') AND group_key IS NOT NULL")
Index(
    "ix_sqlqueue_jobs_group",
    jobs.c.group_key,
    jobs.c.id,
    postgresql_where=_GROUPED_UNFINISHED,
    sqlite_where=_GROUPED_UNFINISHED,
)
# Operators: counts by status, queue and type come from this index alone (0005).
Index("ix_sqlqueue_jobs_status", jobs.c.status, jobs.c.queue, jobs.c.job_type)
# Retention, "dead in the last hour" and the counts of recently finished jobs: finished jobs by
# when they finished, with their queue and type, so counting reads the index alone (0005).
_FINISHED = text("finished_at IS NOT NULL")
Index(
    "ix_sqlqueue_jobs_finished",
    jobs.c.status,
    jobs.c.finished_at,
    jobs.c.queue,
    jobs.c.job_type,
    postgresql_where=_FINISHED,
    sqlite_where=_FINISHED,
)
# Dead jobs waiting for a person: what requeue_where, discard_where and the top errors read (0005).
_UNHANDLED_DEAD = text("status = 'dead' AND requeued_as IS NULL AND discarded_at IS NULL")
Index(
    "ix_sqlqueue_jobs_unhandled_dead",
    jobs.c.id,
    postgresql_where=_UNHANDLED_DEAD,
    sqlite_where=_UNHANDLED_DEAD,
)

# The most frequent errors of unhandled failures, on the overview: grouped by their first
# ERROR_GROUP_CHARS characters, counted from a rollup (``error_counts`` below, 0019; 0014's
# SQLite index on this expression went with it).
ERROR_GROUP_CHARS = 200
ERROR_GROUP = func.substr(
    jobs.c.last_error, literal_column("1"), literal_column(str(ERROR_GROUP_CHARS))
)

# Batches (0009): a batch's jobs by status, for its live counts (children waiting or running).
_IN_BATCH = text("batch_id IS NOT NULL")
Index(
    "ix_sqlqueue_jobs_batch",
    jobs.c.batch_id,
    jobs.c.status,
    postgresql_where=_IN_BATCH,
    sqlite_where=_IN_BATCH,
)


# Concurrency limits (0013): the claimable jobs of each limit key of a task in claim order (a
# limited claim reads one key's), and the keys themselves (which have jobs waiting).
Index(
    "ix_sqlqueue_jobs_limit",
    jobs.c.job_type,
    jobs.c.limit_key,
    jobs.c.priority,
    jobs.c.next_run_at,
    jobs.c.id,
    postgresql_where=_CLAIMABLE_LIMITED,
    sqlite_where=_CLAIMABLE_LIMITED,
).ddl_if(dialect=("postgresql", "sqlite"))  # type: ignore[arg-type]  # a tuple is documented
# The running jobs under a limit key (0018): a limited claim counts a key's running jobs, and
# its walk over the keys tells the full ones, one probe a key (MariaDB/MySQL: the index below).
_RUNNING_LIMITED = text("status = 'running' AND limit_key IS NOT NULL")
Index(
    "ix_sqlqueue_jobs_limit_running",
    jobs.c.job_type,
    jobs.c.limit_key,
    postgresql_where=_RUNNING_LIMITED,
    sqlite_where=_RUNNING_LIMITED,
).ddl_if(dialect=("postgresql", "sqlite"))  # type: ignore[arg-type]  # a tuple is documented
# MariaDB/MySQL (no partial indexes): by status, as the claim reads them.
Index(
    "ix_sqlqueue_jobs_limit_by_status",
    jobs.c.job_type,
    jobs.c.limit_key,
    jobs.c.status,
    jobs.c.priority,
    jobs.c.next_run_at,
    jobs.c.id,
).ddl_if(dialect=MYSQL_NAMES)  # type: ignore[arg-type]  # a tuple is documented

# Flow control gates (added by 0004), shared by every worker: a token bucket per rate-limit key,
# and the state of each circuit breaker key (see sqlqueue/_policies/rate_limit.py and
# sqlqueue/_policies/circuit_breaker.py).
rate_limits = Table(
    "sqlqueue_rate_limits",
    metadata,
    Column("key", String(255), primary_key=True),
    Column("tokens", Number, nullable=False),
    # The database time ``tokens`` was counted at; the refill since then is computed on take.
    Column("refilled_at", UtcDateTime, nullable=False),
    **_MYSQL_TABLE,
)

circuit_breakers = Table(
    "sqlqueue_circuit_breakers",
    metadata,
    Column("key", String(255), primary_key=True),
    Column("state", String(16), nullable=False),
    # Consecutive failures of the current streak, and when its first one happened.
    Column("failures", Integer, nullable=False),
    Column("streak_started_at", UtcDateTime, nullable=True),
    # While open: when the cool-down ends and a probe may go through.
    Column("open_until", UtcDateTime, nullable=True),
    # While half-open: the attempt (job id and attempt number) that holds the single probe.
    Column("probe_job_id", Id, nullable=True),
    Column("probe_attempt", Integer, nullable=True),
    Column("changed_at", UtcDateTime, nullable=False),
    CheckConstraint("state IN ('closed', 'open', 'half_open')", name="state"),
    **_MYSQL_TABLE,
)

# Operations (added by 0005). A queue paused by an operator: no worker claims from it until it is
# resumed (a row with ``paused_at`` NULL is a queue that was paused once and resumed).
queues = Table(
    "sqlqueue_queues",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("paused_at", UtcDateTime, nullable=True),
    Column("paused_by", String(255), nullable=True),
    Column("pause_reason", Text, nullable=True),
    Column("updated_at", UtcDateTime, nullable=False),
    # At most this many of the queue's jobs running at once across all workers (0013); NULL:
    # no limit. Its row is also the lock a limited claim of the queue holds while it counts.
    Column("max_running", Integer, nullable=True),
    **_MYSQL_TABLE,
)

# Concurrency limits (0013): one row per (task, key) whose lock a limited claim holds while it
# counts the key's running jobs and leases what fits; created by the first claim of the key.
limit_keys = Table(
    "sqlqueue_limit_keys",
    metadata,
    Column("job_type", String(200), primary_key=True),
    Column("limit_key", exact_text(255), primary_key=True),
    **_MYSQL_TABLE,
)

# Counts of finished jobs (whose status, queue and type never change again) that finished before
# the mark's ``folded_until``: stats add the jobs finished since, so they never count the whole
# history. A worker folds newly finished jobs in every minute; prune subtracts what it deletes.
finished_counts = Table(
    "sqlqueue_finished_counts",
    metadata,
    Column("status", String(16), primary_key=True),
    Column("queue", String(100), primary_key=True),
    Column("job_type", String(200), primary_key=True),
    Column("count", BigInteger, nullable=False),
    **_MYSQL_TABLE,
)

# The errors of unhandled dead jobs that finished before the counts' mark, by their first
# ERROR_GROUP_CHARS characters (0019): folded with the finished counts, so the overview's top
# errors read these rows and the few jobs that died since, never every dead job; requeue,
# discard and prune subtract what they take away (see sqlqueue/_store/error_counts.py).
error_counts = Table(
    "sqlqueue_error_counts",
    metadata,
    Column("error", exact_text(ERROR_GROUP_CHARS), primary_key=True),
    Column("count", BigInteger, nullable=False),
    **_MYSQL_TABLE,
)

count_marks = Table(
    "sqlqueue_count_marks",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("folded_until", UtcDateTime, nullable=False),
    **_MYSQL_TABLE,
)

# A maintenance duty that one worker at a time performs across every host (retention): the
# holder's lease on it, taken and renewed atomically by the database clock.
duties = Table(
    "sqlqueue_duties",
    metadata,
    Column("name", String(100), primary_key=True),
    Column("holder", String(255), nullable=False),
    Column("expires_at", UtcDateTime, nullable=False),
    **_MYSQL_TABLE,
)

# Webhook endpoints (added by 0006), the receivers of the webhook kind (see sqlqueue/webhooks/).
webhook_endpoints = Table(
    "sqlqueue_webhook_endpoints",
    metadata,
    Column("name", String(200), primary_key=True),
    Column("url", Text, nullable=False),
    # The signing secrets, newest first: [{"secret": "whsec_…", "expires_at": ISO time or null}].
    # An old secret keeps signing, beside the new one, until its grace after a rotation ends.
    Column("secrets", JsonDocument, nullable=False),
    # 4xx statuses this receiver uses for "try again later" (other 4xx go to dead at once).
    Column("retry_statuses", JsonDocument, nullable=False),
    Column("enabled", Boolean, nullable=False),
    Column("disabled_reason", Text, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("updated_at", UtcDateTime, nullable=False),
    **_MYSQL_TABLE,
)

# The email kind's ledger of sent messages (added by 0007; see sqlqueue/email/_ledger.py): one
# row per message the SMTP server accepted, written in the same transaction as its job's success,
# so an attempt that finds its key here does not send again.
email_sent = Table(
    "sqlqueue_email_sent",
    metadata,
    # The message's dedup key (the job's idempotency key), or its Message-ID when it has none.
    Column("key", String(255), primary_key=True),
    Column("message_id", String(255), nullable=False),
    Column("job_id", Id, nullable=False),
    # The database time of the sending attempt, and the server's final reply to it.
    Column("sent_at", UtcDateTime, nullable=False),
    Column("reply", Text, nullable=False),
    # Recipients the server took, and those it refused with its reply to each.
    Column("accepted", JsonDocument, nullable=False),
    Column("refused", JsonDocument, nullable=False),
    **_MYSQL_TABLE,
)

# Batches (added by 0009; see sqlqueue/_store/batches.py): a group of jobs with a callback job
# enqueued once, when the last of them ends. Each child's move to a terminal status counts here,
# in the same transaction; the transaction that makes the count reach ``total`` enqueues the
# callback and sets ``finished_at``.
batches = Table(
    "sqlqueue_batches",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    # Children so far (``add_to_batch`` adds to it), and how many of them ended each way.
    Column("total", Integer, nullable=False),
    Column("succeeded", Integer, nullable=False),
    Column("dead", Integer, nullable=False),
    Column("cancelled", Integer, nullable=False),
    # The checked callback jobs as enqueue wrote them (type, queue, options, encoded payload):
    # ``on_dead`` runs instead of ``on_complete`` when a child ended dead.
    Column("on_complete", JsonDocument, nullable=True),
    Column("on_dead", JsonDocument, nullable=True),
    Column("callback_job_id", Id, nullable=True),
    Column("created_at", UtcDateTime, nullable=False),
    Column("finished_at", UtcDateTime, nullable=True),
    # Workflows (added by 0013): a batch whose children wait for each other. NULL for a plain
    # batch; for a workflow, what a dead step does to the steps after it (wait, cancel, run).
    Column("workflow_on_dead", String(16), nullable=True),
    **_MYSQL_TABLE,
)

# The Workflows list (0017): the workflows' ids, newest first, without passing over the plain
# batches among them. MariaDB/MySQL (no partial indexes) read the primary key instead.
_WORKFLOW = text("workflow_on_dead IS NOT NULL")
Index(
    "ix_sqlqueue_batches_workflows",
    batches.c.id,
    postgresql_where=_WORKFLOW,
    sqlite_where=_WORKFLOW,
).ddl_if(dialect=("postgresql", "sqlite"))  # type: ignore[arg-type]  # a tuple is documented

# Workflows (added by 0013; see sqlqueue/_store/workflows.py): each step of a workflow (a batch
# with ``workflow_on_dead`` set), its current job (a requeued step's new job takes its place
# while the workflow has not finished), and how many of its upstream steps have not yet ended;
# ``settled`` once its ending was counted in the steps after it by a job it no longer has
# (requeued under on_dead="run"), so that it counts once (a step counted by its current job's
# ending needs no mark: the job's status).
workflow_steps = Table(
    "sqlqueue_workflow_steps",
    metadata,
    Column("workflow_id", Id, primary_key=True),
    Column("name", exact_text(200), primary_key=True),
    Column("job_id", Id, nullable=False),
    Column("waiting_on", Integer, nullable=False),
    Column("settled", Boolean, nullable=False),
    **_MYSQL_TABLE,
)
# The step of a job: what an ending looks up. Unique (0021): a job is one step at most, and
# the planner then knows ``job_id IN (…)`` matches a row per value, statistics or not.
Index("uq_sqlqueue_workflow_steps_job", workflow_steps.c.job_id, unique=True)

# The edges of a workflow's graph, by step name: ``downstream`` runs after ``upstream``.
workflow_edges = Table(
    "sqlqueue_workflow_edges",
    metadata,
    Column("workflow_id", Id, primary_key=True),
    Column("upstream", exact_text(200), primary_key=True),
    Column("downstream", exact_text(200), primary_key=True),
    **_MYSQL_TABLE,
)
# The steps a step runs after (``ctx.upstream_results``).
Index(
    "ix_sqlqueue_workflow_edges_downstream",
    workflow_edges.c.workflow_id,
    workflow_edges.c.downstream,
)

# Live workers (added by 0010; see sqlqueue/_store/workers.py): one row per worker process, written
# by its upkeep every heartbeat interval and deleted at a clean exit. A row whose ``expires_at``
# (three intervals after ``last_seen_at``, by the database clock) has passed is a worker gone
# without a word. ``health`` reads which job types the live workers of each queue know.
workers = Table(
    "sqlqueue_workers",
    metadata,
    Column("id", String(255), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("version", String(50), nullable=False),
    # {queue: the slots of its pool}; and the job types it has tasks for (null: it claims every
    # type, the ``unknown_jobs="dead"`` policy).
    Column("queues", JsonDocument, nullable=False),
    Column("job_types", JsonDocument, nullable=True),
    Column("running", Integer, nullable=False),
    Column("stopping", Boolean, nullable=False),
    Column("started_at", UtcDateTime, nullable=False),
    Column("last_seen_at", UtcDateTime, nullable=False),
    Column("expires_at", UtcDateTime, nullable=False),
    **_MYSQL_TABLE,
)

# Operators' actions on jobs that leave no trace in the job's own columns (added by 0012): who
# cancelled a job, made it due now or gave it a new run time, when and why, one row per job and
# action, written in the transaction that changed the job (see sqlqueue/_store/job_actions.py).
# Requeue and discard keep recording on the job row itself.
job_actions = Table(
    "sqlqueue_job_actions",
    metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("job_id", Id, nullable=False),
    Column("action", String(32), nullable=False),
    Column("by", String(255), nullable=False),
    Column("reason", Text, nullable=False),
    # What the action set: {"run_at": ISO time} for a reschedule; null for the others.
    Column("detail", JsonDocument, nullable=True),
    Column("at", UtcDateTime, nullable=False),
    **_MYSQL_TABLE,
)
# A job's actions, in order: what its page shows.
Index("ix_sqlqueue_job_actions_job", job_actions.c.job_id, job_actions.c.id)

# Unique jobs (added by 0015): one row per unique key ever enqueued, written if absent and then
# locked by every enqueue of that key, so concurrent enqueuers of one key take turns (the row
# lock on PostgreSQL and MariaDB/MySQL; SQLite's write lock serialises them anyway) and each
# sees the jobs the previous one committed. The row carries no state: jobs hold it.
unique_keys = Table(
    "sqlqueue_unique_keys",
    metadata,
    Column("key", String(64), primary_key=True),
    **_MYSQL_TABLE,
)

# Job tags (added by 0015; see sqlqueue/_tags.py): one row per job and tag, written with the job.
# A table rather than a JSON column: "jobs tagged t, newest first" is then one B-tree range
# on (tag, job_id) on every backend (MariaDB has no index on JSON array elements, SQLite none).
job_tags = Table(
    "sqlqueue_job_tags",
    metadata,
    Column("tag", String(100), primary_key=True),
    Column("job_id", Id, primary_key=True),
    **_MYSQL_TABLE,
)
# A job's tags (what its page shows, and what pruning deletes with it).
Index("ix_sqlqueue_job_tags_job", job_tags.c.job_id)

# -- the finished history (PostgreSQL only; added by 0020) --------------------------------------
# Succeeded jobs that nothing can act on any more move here from ``sqlqueue_jobs`` (see
# sqlqueue/_store/history.py), into one partition per UTC day of ``finished_at``, so retention
# drops whole days instead of deleting rows. Declared in a MetaData of its own: it exists only
# where the dialect says ``supports_history_partitions``, and ``metadata.create_all`` creates it
# there through the listener below (alembic's comparison of ``metadata`` never sees it).
history_metadata = MetaData(naming_convention=metadata.naming_convention)

#: The parent of the day partitions, with exactly the columns of ``sqlqueue_jobs`` in the same
#: order (the mover inserts what its DELETE returns), no keys, and ``finished_at`` required.
jobs_history = Table(
    "sqlqueue_jobs_history",
    history_metadata,
    *(
        Column(
            column.name,
            column.type,
            nullable=column.nullable and column.name != "finished_at",
        )
        for column in jobs.columns
    ),
    postgresql_partition_by="RANGE (finished_at)",
)
# A job by id (get_job, a page of jobs newest first): one index per partition.
Index("ix_sqlqueue_jobs_history_id", jobs_history.c.id)
# The finished counts read the jobs finished since their mark (none has moved, unless the rollup
# was reset): one index probe answers "nothing here". Jobs move in finishing order, so the mover
# appends at the index's right edge. (BRIN would be smaller, but pages written after it was
# built stay unsummarized, so read, until a vacuum summarizes them: measured, 50 ms a stats().)
Index("ix_sqlqueue_jobs_history_finished", jobs_history.c.finished_at)

#: The dialect names whose databases hold the history table.
HISTORY_DIALECTS = ("postgresql",)


@event.listens_for(metadata, "after_create")
def _create_history(_target: MetaData, connection: Any, **_kw: Any) -> None:
    """``metadata.create_all`` creates the history parent too, where the backend has one."""
    if connection.dialect.name in HISTORY_DIALECTS:
        history_metadata.create_all(connection)


@event.listens_for(metadata, "before_drop")
def _drop_history(_target: MetaData, connection: Any, **_kw: Any) -> None:
    """``metadata.drop_all`` drops the history parent and its partitions too."""
    if connection.dialect.name in HISTORY_DIALECTS:
        jobs_history.drop(connection, checkfirst=True)  # its partitions go with it
