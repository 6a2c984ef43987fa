"""The public entry point: a queue bound to one database, with its tasks."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from types import EllipsisType
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import Engine, create_engine

from sqlqueue._batch import Batch, BatchStatus
from sqlqueue._enqueue import (
    EnqueueSettings,
    Executable,
    build_row,
    check_batch_children,
    check_job,
    enqueue_batch,
    write_rows,
)
from sqlqueue._enqueue_workflow import check_step, check_workflow, enqueue_workflow
from sqlqueue._errors import ConfigurationError
from sqlqueue._job import Job
from sqlqueue._jobrow import JobRow
from sqlqueue._limits import check_integer, check_text
from sqlqueue._liveness import check_connections_at_checkout
from sqlqueue._middleware import EnqueueHook, Hooks, Middleware, Middlewares, check_kind
from sqlqueue._operators.operations import DEFAULT_BATCH_SIZE, Operations
from sqlqueue._payload import DEFAULT_MAX_PAYLOAD_BYTES
from sqlqueue._policies.backoff import Backoff
from sqlqueue._policies.circuit_breaker import CircuitBreaker
from sqlqueue._policies.concurrency import Concurrency
from sqlqueue._policies.periodic import MissedSlots, Periodic
from sqlqueue._policies.rate_limit import RateLimit
from sqlqueue._policies.retention import Retention
from sqlqueue._schema import batches, jobs
from sqlqueue._secrets import Keyring, keyring_from, secret_fields_for
from sqlqueue._store.store import Store
from sqlqueue._task import DEFAULT_MAX_ATTEMPTS, JobRequest, Task, make_task
from sqlqueue._tracing import Tracing, tracing_for
from sqlqueue._unique import Unique
from sqlqueue._worker.loop import Worker
from sqlqueue._worker.settings import WorkerSettings
from sqlqueue._workflow import Workflow, WorkflowHandle, WorkflowStatus
from sqlqueue.dialects import Dialect, dialect_for, with_driver

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["Queue", "UnknownJobPolicy"]

#: What a worker does with a job whose type it has no handler for: ``"skip"`` (the default)
#: never claims it, leaving it queued for a worker that knows the type (``health`` raises
#: ``unknown_type`` when none does); ``"dead"`` claims it and moves it to dead with a clear
#: error, for a deployment where one app alone owns its queues and a stray type is a bug.
UnknownJobPolicy = Literal["dead", "skip"]


class Queue(Operations):
    """Background jobs on the database behind ``engine``.

    ``engine`` is a SQLAlchemy :class:`~sqlalchemy.Engine` (or a URL string). ``lease_seconds``
    is how long a claimed job stays reserved without a heartbeat before the reaper gives it to
    another worker. ``retention`` makes workers prune finished jobs older than it says.
    ``schema`` is the PostgreSQL schema that holds sqlqueue's tables (migrated there with
    ``sqlqueue migrate --schema``); queues in different schemas of one database share nothing.
    The engine itself is left as it is: the app's own statements keep their schemas.
    ``encryption_keys`` (Fernet keys; by default the comma-separated ``SQLQUEUE_ENCRYPTION_KEYS``)
    seal the ``secret_fields`` of tasks: the first key encrypts, all of them decrypt.
    With OpenTelemetry installed (``sqlalchemy-sqlqueue[otel]``) enqueues and attempts are traced on
    ``tracer_provider`` (by default the global one, also when it is set later).

    Operators read and act through the methods of
    :class:`~sqlqueue._operators.operations.Operations` (``stats``, ``health``, ``jobs``,
    ``requeue_where``, ``discard``, ``prune``, ``pause`` …).
    """

    def __init__(
        self,
        engine: Engine | str,
        *,
        lease_seconds: float = 30.0,
        default_queue: str = "default",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_result_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        unknown_jobs: UnknownJobPolicy = "skip",
        async_engine: Any = None,
        retention: Retention | None = None,
        schema: str | None = None,
        encryption_keys: Sequence[str | bytes] | None = None,
        tracer_provider: TracerProvider | None = None,
    ) -> None:
        #: The schema of sqlqueue's tables (``None``: the connection's default schema).
        self.schema = schema
        self._bind(engine)
        if lease_seconds <= 0:
            raise ConfigurationError(f"lease_seconds must be > 0, got {lease_seconds!r}")
        if max_payload_bytes <= 0:
            raise ConfigurationError(f"max_payload_bytes must be > 0, got {max_payload_bytes!r}")
        if max_result_bytes <= 0:
            raise ConfigurationError(f"max_result_bytes must be > 0, got {max_result_bytes!r}")
        if async_engine is not None and not hasattr(async_engine, "sync_engine"):
            raise ConfigurationError(
                f"async_engine: expected a SQLAlchemy AsyncEngine, got {async_engine!r}"
            )
        if retention is not None and not isinstance(retention, Retention):
            raise ConfigurationError(
                f"retention: expected sqlqueue.Retention(...), got {retention!r}"
            )
        check_text("default_queue", default_queue, jobs.c.queue, ConfigurationError)
        if unknown_jobs not in ("dead", "skip"):
            raise ConfigurationError(f"unknown_jobs must be 'dead' or 'skip', got {unknown_jobs!r}")
        self.lease_seconds = float(lease_seconds)
        self.default_queue = default_queue
        self.max_payload_bytes = max_payload_bytes
        self.max_result_bytes = max_result_bytes
        self._async_engine = async_engine
        #: Whether ``_async_engine`` was made here (and so is this queue's to close).
        self._async_engine_made = False
        self.unknown_jobs: UnknownJobPolicy = unknown_jobs
        self.retention = retention
        #: The keys that seal and open secret fields (``None``: no keys configured).
        self.keyring: Keyring | None = keyring_from(encryption_keys)
        #: The producer and consumer spans (``None``: OpenTelemetry is not installed).
        self.tracing: Tracing | None = tracing_for(tracer_provider)
        self._tasks: dict[str, Task] = {}
        self._middlewares = Middlewares()
        self._hooks = Hooks()
        self._periodic: list[Periodic] = []
        #: Queues that jobs of registered tasks are enqueued to besides their tasks' own (the
        #: Django Tasks framework's ``queue_name``s): a worker serving one does not warn that no
        #: task uses it.
        self._enqueued_elsewhere: set[str] = set()

    def _bind(self, engine: Engine | str) -> None:
        """Bind the queue to the database of ``engine`` (a subclass that finds its database
        later, at each use, binds nothing here: see sqlqueue/django/_lazy.py)."""
        built_here = isinstance(engine, str)
        if isinstance(engine, str):
            engine = create_engine(with_driver(engine))
        if hasattr(engine, "sync_engine"):  # an AsyncEngine (without importing asyncio support)
            raise ConfigurationError(
                "engine: Queue needs a synchronous Engine (workers run their SQL in a thread); "
                "build one from the same URL with a sync driver, and use enqueue_async with "
                "your AsyncConnection or AsyncSession"
            )
        if not isinstance(engine, Engine):
            raise ConfigurationError(f"engine: expected a SQLAlchemy Engine or URL, got {engine!r}")
        self.engine = engine
        self.dialect: Dialect = dialect_for(engine, self.schema)
        self.dialect.check_url(engine.url, lasting=True)
        self.dialect.home = engine
        self.dialect.prepare_engine(engine)
        if built_here and self.dialect.supports_many_hosts:
            # A pooled connection the server dropped while idle is replaced at checkout instead
            # of failing the next claim or completion and starting a backoff (see _liveness.py).
            # A database file has no server to drop connections: SQLite needs no checks.
            check_connections_at_checkout(engine, self.dialect)
        self.store = Store(self.dialect.bind_tables(engine), self.dialect)

    def async_engine(self) -> Any:
        """The ``AsyncEngine`` async handlers' transactions run on: the one given, or one made
        from this engine's URL with the backend's asyncio driver (needs the extra
        ``sqlalchemy-sqlqueue[async]``)."""
        if self._async_engine is None:
            from sqlalchemy.ext.asyncio import create_async_engine

            engine = create_async_engine(self.dialect.async_url(self.engine.url))
            self.dialect.prepare_engine(engine.sync_engine)
            self._async_engine = engine
            self._async_engine_made = True
        return self._async_engine

    async def _close_async_connections(self) -> None:
        """Close the idle pooled connections of the async engine this queue made, on the
        running loop. An asyncio driver's connection belongs to the loop that opened it: left in
        the pool after that loop closes, it can neither be used by a later loop (a second
        ``drain()``, a worker run again) nor closed when it is collected ("Event loop is
        closed"). An engine given to the queue is its owner's to dispose."""
        if self._async_engine_made and self._async_engine is not None:
            await self._async_engine.dispose()

    # -- tasks --------------------------------------------------------------------------------

    @property
    def tasks(self) -> Mapping[str, Task]:
        """The registered tasks by name."""
        return dict(self._tasks)

    def task(
        self,
        name: str,
        *,
        queue: str | None = None,
        priority: int = 0,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        timeout: float | None = None,
        backoff: Backoff | Sequence[float] | None = None,
        retry_on: Iterable[type[BaseException]] | type[BaseException] | None = None,
        rate_limit: RateLimit | None = None,
        circuit_breaker: CircuitBreaker | None = None,
        secret_fields: Iterable[str] | None = None,
        concurrency: Concurrency | None = None,
        unique: Unique | None = None,
        tags: Iterable[str] | None = None,
    ) -> Callable[[Callable[..., Any]], Task]:
        """Register the decorated function (sync or ``async``) as the handler of ``name``.

        ``rate_limit`` and ``circuit_breaker`` gate its attempts per key, across all workers;
        ``concurrency`` (a :class:`Concurrency`) caps how many of them run at once, in total
        or per key, across all workers.
        ``secret_fields`` (dotted paths into the payload, e.g. ``["token", "card.number"]``)
        are encrypted with the queue's ``encryption_keys`` before the row is written; the
        handler gets them in the clear, everything else shows ``"***"``.
        ``unique`` (a :class:`~sqlqueue.Unique`) keeps at most one job per key among those in
        its ``states``. ``tags`` label every job of the task (``queue.jobs(tag=…)``).
        """

        def register(handler: Callable[..., Any]) -> Task:
            if name in self._tasks:
                raise ConfigurationError(f"a task named {name!r} is already registered")
            task = make_task(
                self,
                name,
                handler,
                queue=queue or self.default_queue,
                priority=priority,
                max_attempts=max_attempts,
                timeout=timeout,
                backoff=backoff,
                retry_on=retry_on,
                rate_limit=rate_limit,
                circuit_breaker=circuit_breaker,
                concurrency=concurrency,
                secrets=secret_fields_for(name, secret_fields, self.keyring),
                tracing=self.tracing,
                middlewares=self._middlewares,
                unique=unique,
                tags=tags,
            )
            self._tasks[name] = task
            return task

        return register

    def middleware(self, middleware: Middleware) -> Middleware:
        """Register ``def mw(job, call_next)`` (or ``async def``, awaiting ``call_next()``)
        around every attempt of every task, the first registered outermost: code before,
        ``result = call_next()`` runs the rest of the chain and the handler (and raises what
        it raises), code after; what it returns is the result, what it raises is classified
        like a handler's error. Around an async handler only an async middleware can run
        (a sync one is refused here, with :class:`~sqlqueue.ConfigurationError`); around a sync
        handler both run on the handler's thread. Use as a decorator; returns ``middleware``."""
        for task in self._tasks.values():
            check_kind((middleware,), task.name, task.is_async)
        self._middlewares.add(middleware)
        for task in self._tasks.values():
            task.replan()
        return middleware

    def _meter_calls(self, worker_id: str, meter: Any | None) -> None:
        """Start (``meter``) or stop (``None``) the built-in ``metrics`` middleware for the
        handler calls of worker ``worker_id`` (sqlqueue/_worker/call_metrics.py), and plan the
        tasks again: the step is in their plans only while some worker serves metrics."""
        self._middlewares.meter(worker_id, meter)
        for task in self._tasks.values():
            task.replan()

    def on_enqueue(self, hook: EnqueueHook) -> EnqueueHook:
        """Register ``def hook(request: JobRequest) -> JobRequest``, called before each job is
        written (``enqueue``, ``enqueue_many``, batches and their callbacks, ``ctx``'s
        follow-ups, periodic jobs; sync or async): it returns the request to write — the same
        or an altered copy (``dataclasses.replace``) — or raises :class:`~sqlqueue.EnqueueError`
        to refuse it, and nothing of that call is written. Hooks run in registration order,
        each on what the previous returned. Use as a decorator; returns ``hook``."""
        self._hooks.add(hook)
        return hook

    @property
    def periodic_schedules(self) -> Sequence[Periodic]:
        """The cron schedules declared with :meth:`periodic`."""
        return tuple(self._periodic)

    def periodic(
        self,
        cron: str,
        name: str,
        *,
        payload: Mapping[str, Any] | None = None,
        timezone: str = "UTC",
        missed: MissedSlots = "latest",
        grace_seconds: float = 60.0,
        **task_options: Any,
    ) -> Callable[[Callable[..., Any]], Task]:
        """Register the decorated handler as task ``name`` and run it on a cron schedule.

        Every worker's scheduler enqueues each slot, exactly once overall (the slot is the
        job's idempotency key). ``missed="latest"`` runs the most recent slot missed while no
        worker ran; ``"skip"`` drops slots older than ``grace_seconds``. ``task_options`` are
        those of :meth:`task`.
        """
        schedule = Periodic(
            cron=cron,
            task=name,
            payload=dict(payload or {}),
            timezone=timezone,
            missed=missed,
            grace_seconds=grace_seconds,
        )

        def register(handler: Callable[..., Any]) -> Task:
            task = self.task(name, **task_options)(handler)
            self._periodic.append(schedule)
            return task

        return register

    # -- enqueue ------------------------------------------------------------------------------

    @property
    def _settings(self) -> EnqueueSettings:
        return EnqueueSettings(
            tasks=self._tasks,
            default_queue=self.default_queue,
            max_payload_bytes=self.max_payload_bytes,
            dialect=self.dialect,
            hooks=self._hooks.chain,
        )

    def enqueue(
        self,
        conn: Executable,
        job_type: str,
        payload: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        group_key: str | None = None,
        delay: float | None = None,
        run_at: datetime | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        external: bool = False,
        unique: Unique | None = None,
        expires_in: float | None = None,
        expires_at: datetime | None = None,
        tags: Sequence[str] | None = None,
    ) -> int:
        """Write one job in the caller's transaction (``Connection`` or ``Session``); return its id.

        With an ``idempotency_key`` that a kept job already has, return that job's id and write
        nothing. Jobs sharing a ``group_key`` run one at a time, in enqueue order.
        ``external=True`` allows a job type this queue has no task for. ``unique`` (overriding
        the task's) returns the id of an existing job with the same key in the statuses it
        names, kept or replaced (see :class:`~sqlqueue.Unique`). A job not started within
        ``expires_in`` seconds, or by ``expires_at``, is cancelled (reason ``expired``) instead.
        ``tags`` (added to the task's) label the job for ``jobs(tag=…)``.
        """
        row = check_job(  # the settings one by one: no EnqueueSettings per job
            self._tasks,
            self.default_queue,
            self.max_payload_bytes,
            job_type,
            payload,
            idempotency_key,
            group_key,
            delay,
            run_at,
            priority,
            queue,
            max_attempts,
            external,
            self._hooks.chain,
            unique,
            expires_in,
            expires_at,
            tags,
        )
        return self._write(conn, [row])[0]

    async def enqueue_async(
        self, conn: Any, job_type: str, payload: Mapping[str, Any] | None = None, **options: Any
    ) -> int:
        """:meth:`enqueue` through an ``AsyncConnection`` or ``AsyncSession``."""
        return int(
            await conn.run_sync(
                lambda sync_conn: self.enqueue(sync_conn, job_type, payload, **options)
            )
        )

    def enqueue_many(self, conn: Executable, requests: Iterable[JobRequest]) -> list[int]:
        """Write many jobs in the caller's transaction, in one round trip per thousands of rows.

        Returns one id per request, in order; duplicates by idempotency key get the first id.
        """
        settings = self._settings
        return self._write(conn, [build_row(settings, request) for request in requests])

    def _write(self, conn: Executable, rows: list[JobRow]) -> list[int]:
        """Insert checked ``rows`` in the caller's transaction, in the producer span when
        tracing is on; one id per row."""
        if self.tracing is None or not rows:
            return write_rows(self.dialect, conn, rows)
        return self.tracing.send(rows, lambda: write_rows(self.dialect, conn, rows))

    async def enqueue_many_async(self, conn: Any, requests: Iterable[JobRequest]) -> list[int]:
        """:meth:`enqueue_many` through an ``AsyncConnection`` or ``AsyncSession``."""
        batch = list(requests)
        ids: list[int] = await conn.run_sync(lambda sync_conn: self.enqueue_many(sync_conn, batch))
        return ids

    # -- batches ------------------------------------------------------------------------------

    def enqueue_batch(
        self,
        conn: Executable,
        requests: Iterable[JobRequest],
        *,
        on_complete: JobRequest | None = None,
        on_dead: JobRequest | None = None,
    ) -> Batch:
        """Write a batch of jobs and its row in the caller's transaction (``Connection`` or
        ``Session``); return its id and its children's ids.

        When the last child ends (succeeded, dead or cancelled), ``on_complete`` is enqueued
        exactly once, as an ordinary job whose ``ctx.batch`` is this batch; ``on_dead``, if
        given, instead of it when any child ended dead. An empty batch is finished at once.
        Children and callbacks take no idempotency key (see the README's "Batches").
        """
        return enqueue_batch(
            self._settings,
            conn,
            requests,
            on_complete=on_complete,
            on_dead=on_dead,
            send=None if self.tracing is None else self.tracing.send,
        )

    async def enqueue_batch_async(
        self,
        conn: Any,
        requests: Iterable[JobRequest],
        *,
        on_complete: JobRequest | None = None,
        on_dead: JobRequest | None = None,
    ) -> Batch:
        """:meth:`enqueue_batch` through an ``AsyncConnection`` or ``AsyncSession``."""
        batch: Batch = await conn.run_sync(
            lambda sync_conn: self.enqueue_batch(
                sync_conn, requests, on_complete=on_complete, on_dead=on_dead
            )
        )
        return batch

    def get_batch(self, batch_id: int) -> BatchStatus | None:
        """The batch with ``batch_id`` and its children's counts by status, or ``None``."""
        check_integer("batch_id", batch_id, batches.c.id, ConfigurationError, low=0)
        return self.store.get_batch(batch_id)

    def _batch_rows(self, requests: Iterable[JobRequest]) -> list[JobRow]:
        """``requests`` checked as a batch's children (what ``ctx.add_to_batch`` writes), with
        the running attempt's trace context: they continue its trace."""
        rows = check_batch_children(self._settings, requests)
        if self.tracing is not None:
            self.tracing.stamp(rows)
        return rows

    # -- workflows ----------------------------------------------------------------------------

    def enqueue_workflow(self, conn: Executable, workflow: Workflow) -> WorkflowHandle:
        """Write ``workflow``'s steps in the caller's transaction (``Connection``, ``Session``,
        or an ``Engine`` for a transaction of its own); return its id and each step's job id.
        Steps with upstream steps wait until those have all ended (see :class:`Workflow`)."""
        send = None if self.tracing is None else self.tracing.send
        return enqueue_workflow(self._settings, conn, workflow, send)

    async def enqueue_workflow_async(self, conn: Any, workflow: Workflow) -> WorkflowHandle:
        """:meth:`enqueue_workflow` through an ``AsyncConnection`` or ``AsyncSession``."""
        check_workflow(self._settings, workflow)  # before any SQL, in the caller's task
        handle: WorkflowHandle = await conn.run_sync(
            lambda sync_conn: self.enqueue_workflow(sync_conn, workflow)
        )
        return handle

    def get_workflow(self, workflow_id: int) -> WorkflowStatus | None:
        """The workflow with ``workflow_id`` and each step's status, or ``None``."""
        check_integer("workflow_id", workflow_id, batches.c.id, ConfigurationError, low=0)
        return self.store.get_workflow(workflow_id)

    def _workflow_row(self, name: str, request: JobRequest) -> JobRow:
        """``request`` checked as step ``name`` added by a running step
        (``ctx.add_to_workflow``), with the attempt's trace context, as a workflow's steps are
        checked (:func:`check_step`)."""
        row = check_step(self._settings, name, request)
        if self.tracing is not None:
            self.tracing.stamp([row])
        return row

    # -- inspection and dead letters ----------------------------------------------------------

    def get_job(self, job_id: int) -> Job | None:
        """The job with ``job_id`` as a frozen snapshot, or ``None``."""
        check_integer("job_id", job_id, jobs.c.id, ConfigurationError, low=0)
        return self.store.get_job(job_id)

    def cancel(self, job_id: int, *, by: str | None = None, reason: str | None = None) -> Job:
        """Cancel a queued, failed or waiting job now, or ask a running job's handler to stop
        (``ctx.cancelled``; if that attempt fails, the job ends ``cancelled``, not retried).
        Returns the job as it now is. With ``by`` and ``reason`` (an operator's cancel), the
        job records who and why (:meth:`job_actions`)."""
        record = self._record("cancel", by, reason)
        check_integer("job_id", job_id, jobs.c.id, ConfigurationError, low=0)
        return self.store.cancel(job_id, record)

    def cancel_where(
        self,
        *,
        job_type: str | None = None,
        queue: str | None = None,
        group_key: str | None = None,
        status: str | None = None,
        error_contains: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        job_ids: Iterable[int] | None = None,
        by: str | None = None,
        reason: str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
    ) -> int:
        """Cancel every queued, failed or waiting job (a workflow step not released yet)
        matching all the given filters (as :meth:`jobs` reads them; ``status`` narrows to
        ``"queued"``, ``"failed"`` or ``"waiting"``), in batches of ``batch_size``
        (one short transaction each), oldest first; return how many. Running jobs are left
        alone (see :meth:`cancel`). A job whose row another transaction holds (a worker's
        claim) is waited for, then cancelled if it is still waiting. With ``by`` and
        ``reason``, each job records who and why (:meth:`job_actions`)."""
        if all(
            value is None
            for value in (job_type, queue, group_key, error_contains, since, until, job_ids)
        ):
            raise ConfigurationError(
                "cancel_where needs at least one of job_type, queue, group_key, "
                "error_contains, since, until, job_ids"
            )
        if error_contains == "":
            raise ConfigurationError(
                "error_contains must not be empty (it would match every job); pass None for "
                "no filter"
            )
        record = self._record("cancel_where", by, reason)
        if record is not None:
            record = replace(record, action="cancel")
        job_filter = self._job_filter(
            status, job_type, queue, error_contains, since, until, job_ids, group_key, None
        )

        def cancel_batch(size: int) -> tuple[list[int], bool]:
            batch = self.admin.cancel_batch(job_filter, limit=size, record=record)
            return batch.cancelled, batch.exhausted

        return len(self._in_batches(cancel_batch, None, batch_size))

    def rebind(self, engine: Engine | str, *, schema: str | EllipsisType | None = ...) -> Queue:
        """The same tasks, schedules and settings on another database (the CLI's
        ``--database-url``), or in another ``schema`` of it (``--schema``; by default this
        queue's)."""
        other = Queue(
            engine,
            schema=self.schema if isinstance(schema, EllipsisType) else schema,
            lease_seconds=self.lease_seconds,
            default_queue=self.default_queue,
            max_payload_bytes=self.max_payload_bytes,
            max_result_bytes=self.max_result_bytes,
            unknown_jobs=self.unknown_jobs,
            retention=self.retention,
            encryption_keys=(),  # this queue's keys, below, whatever the environment says
        )
        other.keyring = self.keyring
        other.tracing = self.tracing  # one set of open spans for the tasks and the workers
        other._middlewares = self._middlewares
        other._hooks = self._hooks
        other._tasks = {name: replace(task, owner=other) for name, task in self._tasks.items()}
        other._periodic = list(self._periodic)
        return other

    # -- workers ------------------------------------------------------------------------------

    def worker(
        self,
        *,
        queues: Sequence[str] | Mapping[str, int] | None = None,
        concurrency: int = 4,
        poll_interval: float = 1.0,
        shutdown_timeout: float = 30.0,
        reaper_interval: float | None = None,
        listen: bool = True,
        metrics_port: int | None = None,
        metrics_interval: float = 15.0,
    ) -> Worker:
        """A worker for this queue's tasks; call ``.run()`` to start it.

        ``queues`` is a list of queue names sharing ``concurrency`` slots (default: the queues
        of this queue's tasks), or a mapping of queue name to its own slots, e.g.
        ``{"mail": 4, "reports": 1}``, so one queue can never starve another. ``listen=False``
        turns PostgreSQL wake-ups off and polls every ``poll_interval`` only: LISTEN does not
        work through PgBouncer in transaction mode. ``metrics_port`` serves Prometheus metrics
        on ``/metrics`` there (extra ``prometheus``); the queue gauges re-read :meth:`stats`
        at most every ``metrics_interval`` seconds.
        """
        if isinstance(queues, str):
            raise ConfigurationError(f"queues must be a list of names, not {queues!r}")
        return Worker(
            self,
            WorkerSettings(
                queues=(
                    dict(queues)
                    if isinstance(queues, Mapping)
                    else tuple(queues)
                    if queues is not None
                    else None
                ),
                concurrency=concurrency,
                poll_interval=poll_interval,
                shutdown_timeout=shutdown_timeout,
                reaper_interval=reaper_interval,
                listen=listen,
                metrics_port=metrics_port,
                metrics_interval=metrics_interval,
            ),
        )
