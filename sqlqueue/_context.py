"""The handler's context: facts about the running job, and what a handler may do about it.

A handler asks for it by annotating a parameter with :class:`JobContext`::

    @queue.task("import_rows")
    def import_rows(batch_id: int, ctx: sqlqueue.JobContext) -> int:
        with ctx.transaction() as conn:        # commits together with the job's success
            conn.execute(rows.insert(), ...)
        return 42                              # stored as the job's result

Handlers that do not declare it get plain keyword arguments, as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, MutableMapping
from contextlib import asynccontextmanager, contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from sqlqueue import _step_context as step_context
from sqlqueue._batch import BatchStatus
from sqlqueue._errors import ConfigurationError, JobStateError, PayloadError
from sqlqueue._job import ErrorRecord
from sqlqueue._jobrow import JobRow
from sqlqueue._logs import job_fields
from sqlqueue._payload import check_result
from sqlqueue._progress import check_progress
from sqlqueue._store import batches
from sqlqueue._store.claim_floor import Released
from sqlqueue._store.rows import ClaimedJob, error_record
from sqlqueue._store.transactions import translated
from sqlqueue._workflow import WorkflowStatus

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from sqlqueue._task import JobRequest
    from sqlqueue.dialects import Dialect

__all__ = ["JobContext"]


class _JobLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Prefixes every message with the job it is about: ``[job 12 send_email #2]``, and puts
    the job's fields (``job_id``, ``job_type``, ``queue``, ``attempt``, ``worker_id``) on the
    record as ``extra``."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, Any]:
        extra = self.extra or {}
        prefix = f"[job {extra['job_id']} {extra['job_type']} #{extra['attempt']}]"
        kwargs.setdefault("extra", {}).update(extra)
        return f"{prefix} {msg}", kwargs


class JobDatabase(Protocol):
    """What a job's context needs of the queue that claimed the job: its database (the engine,
    its dialect for write transactions, the schema of sqlqueue's tables, and the async engine),
    not the whole queue."""

    engine: Engine
    dialect: Dialect
    schema: str | None
    max_result_bytes: int

    def async_engine(self) -> Any:
        """The ``AsyncEngine`` for ``async def`` handlers' transactions."""

    def get_batch(self, batch_id: int) -> BatchStatus | None:
        """A batch and its counts (``ctx.batch``)."""

    def _batch_rows(self, requests: Iterable[JobRequest]) -> list[JobRow]:
        """``requests`` checked as children of a batch (``ctx.add_to_batch``), before any SQL."""

    def get_workflow(self, workflow_id: int) -> WorkflowStatus | None:
        """A workflow and its steps (``ctx.workflow``)."""

    def _workflow_row(self, name: str, request: JobRequest) -> JobRow:
        """``request`` checked as step ``name`` added by ``ctx.add_to_workflow``, before any
        SQL."""


class JobContext:
    """What a running handler knows about its job, and can do about it.

    Facts: ``job_id``, ``job_type``, ``queue``, ``attempt`` (1 for the first), ``max_attempts``,
    ``enqueued_at``, ``errors`` (the history of earlier failed attempts), ``engine`` (the
    database the job lives in), ``schema`` (that of sqlqueue's tables in it) and ``batch``
    (its batch's counts, read now); ``logger`` is bound to the job. ``cancelled`` turns true when
    the worker is shutting down (or the job is cancelled): a long handler should check it and
    wrap up.
    """

    def __init__(
        self,
        job: ClaimedJob,
        database: JobDatabase,
        *,
        worker_id: str,
        on_progress: Callable[[JobContext], None],
    ) -> None:
        self._job = job
        self._database = database
        self._worker_id = worker_id
        self._on_progress = on_progress
        self._cancelled = threading.Event()
        #: The monotonic time that ``started_at`` was read at: the claim's, when known (a job
        #: claimed ahead may wait in this worker before its handler starts).
        self._started = job.claimed_clock if job.claimed_clock is not None else time.monotonic()
        self._progress: dict[str, Any] | None = None
        self._result: Any = None  # what set_result stored, already checked
        self._sync_tx: Connection | None = None
        self._async_tx: AsyncConnection | None = None
        self._added_to_batch = 0
        #: The queues in which this job's completing transaction made jobs claimable (workflow
        #: steps it released, a batch's callback): the worker wakes their pools.
        self._made_claimable: frozenset[str] = frozenset()
        #: The workflow steps that transaction released (the worker lowers its claim floors).
        self._released: tuple[Released, ...] = ()
        self.logger = _JobLogger(logging.getLogger("sqlqueue.job"), job_fields(job, worker_id))

    # -- facts --------------------------------------------------------------------------------

    @property
    def job_id(self) -> int:
        """The job's id."""
        return self._job.id

    @property
    def job_type(self) -> str:
        """The job's type (its task's name)."""
        return self._job.job_type

    @property
    def queue(self) -> str:
        """The queue the job was claimed from."""
        return self._job.queue

    @property
    def attempt(self) -> int:
        """This attempt's number: 1 for the first."""
        return self._job.attempt

    @property
    def max_attempts(self) -> int:
        """How many attempts the job gets before it is dead."""
        return self._job.max_attempts

    @property
    def enqueued_at(self) -> datetime:
        """When the job was enqueued (database clock)."""
        return self._job.created_at

    @property
    def errors(self) -> tuple[ErrorRecord, ...]:
        """What went wrong in earlier attempts, oldest first."""
        return tuple(error_record(entry) for entry in self._job.errors)

    @property
    def engine(self) -> Engine:
        """The engine of the queue that claimed this job: the database the worker serves, for
        handlers that read or write their own tables outside the job's own transaction."""
        return self._database.engine

    @property
    def schema(self) -> str | None:
        """The schema of the queue's tables (``None``: the connection's default): where a
        handler that reads sqlqueue's own tables (as the email and webhook kinds do) finds
        them. ``engine`` itself is the app's, without it."""
        return self._database.schema

    @property
    def cancelled(self) -> bool:
        """Whether the handler was asked to stop (worker shutdown or job cancellation)."""
        return self._cancelled.is_set()

    def now(self) -> datetime:
        """The database clock's time now (no round trip): the claim's ``started_at`` plus the
        time this process has counted since the claim's rows came back."""
        return self._job.started_at + timedelta(seconds=time.monotonic() - self._started)

    # -- batches ------------------------------------------------------------------------------

    @property
    def batch(self) -> BatchStatus | None:
        """The batch this job belongs to (or, for a batch's callback job, the batch it
        completes), read now; ``None`` for a job outside any batch."""
        batch_id = self._job.batch_id
        return None if batch_id is None else self._database.get_batch(batch_id)

    def add_to_batch(self, requests: Iterable[JobRequest]) -> list[int]:
        """Add children to this job's batch (fan-out from a running child); return their ids.

        They are written in :meth:`transaction`, so they exist only if this job succeeds, and
        the batch counts them from that same commit: it cannot finish before they end. A job
        outside a batch, a batch's callback, a child requeued after its batch finished, or a
        workflow's step (it adds steps with :meth:`add_to_workflow`) cannot add children
        (:class:`JobStateError`; nothing is written).
        """
        batch_id, rows = self._batch_children(requests)
        if not rows:
            return []
        with self.transaction() as conn:
            ids = self._insert_children(conn, batch_id, rows)
        return ids

    async def add_to_batch_async(self, requests: Iterable[JobRequest]) -> list[int]:
        """:meth:`add_to_batch` for ``async def`` handlers, in :meth:`transaction_async`."""
        batch_id, rows = self._batch_children(requests)
        if not rows:
            return []
        async with self.transaction_async() as conn:
            ids: list[int] = await conn.run_sync(
                lambda sync_conn: self._insert_children(sync_conn, batch_id, rows)
            )
        return ids

    @property
    def added_to_batch(self) -> int:
        """How many children this attempt added to its batch (counted when it completes)."""
        return self._added_to_batch

    def _batch_children(self, requests: Iterable[JobRequest]) -> tuple[int, list[JobRow]]:
        batch_id = self._job.batch_id
        if batch_id is None:
            raise JobStateError(
                f"job {self.job_id} ({self.job_type}) is not in a batch: add_to_batch adds "
                "children to the batch of a running child; use queue.enqueue_batch to start one"
            )
        return batch_id, self._database._batch_rows(requests)

    def _insert_children(self, conn: Connection, batch_id: int, rows: list[JobRow]) -> list[int]:
        dialect = self._database.dialect
        refused = translated(dialect, lambda: batches.refuse_children(conn, dialect, batch_id))
        if refused == "workflow":
            raise JobStateError(
                f"job {self.job_id} ({self.job_type}) is a step of workflow {batch_id}: "
                "add_to_batch would add a job that is no step of it; use "
                "ctx.add_to_workflow(name, request, after=[...]) to add a step instead"
            )
        if refused == "finished":
            raise JobStateError(
                f"batch {batch_id} has finished (job {self.job_id} is its callback, or a child "
                "requeued after it finished): children can only be added while the batch runs; "
                "start a new batch instead"
            )
        ids = translated(dialect, lambda: batches.insert_children(conn, dialect, batch_id, rows))
        self._added_to_batch += len(ids)
        return ids

    # -- workflows ----------------------------------------------------------------------------

    @property
    def workflow(self) -> WorkflowStatus | None:
        """The workflow this job is a step of, read now; ``None`` outside any workflow."""
        batch_id = self._job.batch_id
        return None if batch_id is None else self._database.get_workflow(batch_id)

    @property
    def upstream_results(self) -> Mapping[str, Any]:
        """The stored results of the steps this step runs after, by step name (a step that
        ended dead under ``on_dead="run"`` is missing); empty outside any workflow."""
        if self._job.batch_id is None:
            return {}
        return step_context.read_upstream_results(self._database, self.job_id)

    def add_to_workflow(self, name: str, request: JobRequest, *, after: Iterable[str] = ()) -> int:
        """Add step ``name`` to this step's workflow, after the steps in ``after`` (this one or
        any unfinished step; one that succeeded counts as done, one that ended dead or
        cancelled as ``on_dead`` says: under ``"cancel"`` the new step is cancelled at once);
        return its job id. Written in :meth:`transaction`: it exists only if this step
        succeeds, and the workflow cannot finish before it ends."""
        workflow_id, upstream, row = step_context.check_added_step(self, name, request, after)
        with self.transaction() as conn:
            return step_context.write_added_step(self, conn, workflow_id, name, row, upstream)

    async def add_to_workflow_async(
        self, name: str, request: JobRequest, *, after: Iterable[str] = ()
    ) -> int:
        """:meth:`add_to_workflow` for ``async def`` handlers, in :meth:`transaction_async`."""
        workflow_id, upstream, row = step_context.check_added_step(self, name, request, after)
        async with self.transaction_async() as conn:
            job_id: int = await conn.run_sync(
                lambda sync: step_context.write_added_step(
                    self, sync, workflow_id, name, row, upstream
                )
            )
        return job_id

    # -- result -------------------------------------------------------------------------------

    def set_result(self, value: Any) -> None:
        """Store ``value`` as the job's result if this attempt succeeds: for a handler that
        knows its result before it ends (say, before a long clean-up), or a step whose result
        the steps after it read (``ctx.upstream_results``). Any JSON value, checked now as a
        payload is (:class:`PayloadError`, within ``Queue(max_result_bytes=...)``).

        The last of ``set_result`` and the handler's return value wins: a handler that returns
        ``None`` keeps what it set, one that returns a value replaces it; ``set_result(None)``
        clears it. Works the same in ``async def`` handlers (it sends nothing)."""
        try:
            self._result = check_result(value, max_bytes=self._database.max_result_bytes)
        except PayloadError as error:
            raise PayloadError(f"ctx.set_result: {error}") from None

    # -- progress -----------------------------------------------------------------------------

    def progress(self, done: float, total: float | None = None, note: str | None = None) -> None:
        """Report how far the job got; visible in ``get_job`` shortly, and a heartbeat too.

        Never blocks: the worker writes the latest report on its database thread. ``done`` and
        ``total`` are finite numbers >= 0, ``note`` text of at most 1,000 characters that a
        database stores (no NUL): anything else raises :class:`ConfigurationError` here, in
        the handler, rather than a write that fails later.
        """
        checked = check_progress(done, total, note)
        self._progress = {**checked, "at": self.now()}
        self._on_progress(self)

    def take_progress(self) -> dict[str, Any] | None:
        """The latest unreported progress, once (the worker's side of :meth:`progress`)."""
        progress, self._progress = self._progress, None
        return progress

    # -- transactional completion -------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A connection whose writes commit together with this job's success, or not at all.

        The transaction stays open until the handler returns: then the job is marked
        ``succeeded`` in it (fenced on this attempt's lease) and it commits. If the handler
        raises, or the lease was lost meanwhile, everything rolls back. On SQLite the write lock
        is held until then: keep such handlers short.
        """
        if self._async_tx is not None:
            raise ConfigurationError("this attempt already uses transaction_async()")
        if self._sync_tx is None:
            conn = self._database.engine.connect()
            self._database.dialect.begin_write(conn)
            self._sync_tx = conn
        yield self._sync_tx

    @contextmanager
    def session(self) -> Iterator[Session]:
        """An ORM ``Session`` inside :meth:`transaction` (its commit does not end the job's)."""
        with self.transaction() as conn:
            session = Session(bind=conn, join_transaction_mode="create_savepoint")
            try:
                yield session
                session.flush()
            finally:
                session.close()

    @asynccontextmanager
    async def transaction_async(self) -> AsyncIterator[AsyncConnection]:
        """:meth:`transaction` for ``async def`` handlers, on the queue's async engine."""
        if self._sync_tx is not None:
            raise ConfigurationError("this attempt already uses transaction()")
        if self._async_tx is None:
            conn = await self._database.async_engine().connect()
            await conn.run_sync(self._database.dialect.begin_write)
            self._async_tx = conn
        yield self._async_tx

    @property
    def in_transaction(self) -> bool:
        """Whether the handler opened a transaction that will carry its completion."""
        return self._sync_tx is not None or self._async_tx is not None

    def finish_sync(self, complete: Callable[[Connection], bool] | None) -> bool:
        """Complete in the handler's transaction (``complete`` returns whether the fence held)
        and commit; or, with ``complete=None`` (the handler failed), roll back."""
        if self._sync_tx is None:
            return False
        conn = self._sync_tx
        self._sync_tx = None
        try:
            if complete is not None and complete(conn):
                conn.commit()
                return True
            conn.rollback()
            return False
        finally:
            conn.close()

    async def finish_async(self, complete: Callable[[Connection], bool] | None) -> bool:
        """:meth:`finish_sync` for a transaction opened with :meth:`transaction_async`."""
        conn = self._async_tx
        if conn is None:
            return False
        self._async_tx = None
        try:
            if complete is not None and await conn.run_sync(complete):
                await conn.commit()
                return True
            await conn.rollback()
            return False
        finally:
            await conn.close()

    # -- the worker's side --------------------------------------------------------------------

    def cancel(self) -> None:
        """Ask the handler to stop (it sees ``cancelled`` turn true)."""
        self._cancelled.set()

    def result_of(self, returned: Any) -> Any:
        """The result to store for a handler that returned ``returned``: that value, or what
        it gave :meth:`set_result` when it returned ``None``."""
        return self._result if returned is None else returned

    def redact_result(self, redact: Callable[[Any], Any]) -> None:
        """Pass what :meth:`set_result` stored through ``redact`` (the task's secrets are
        scrubbed from a result before it is stored, wherever it came from)."""
        if self._result is not None:
            self._result = redact(self._result)
