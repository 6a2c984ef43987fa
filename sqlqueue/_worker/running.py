"""The contexts of a worker's running jobs: made on demand, cancelled on shutdown, and the
writer that turns their progress reports into database rows.

``JobContext.progress`` never blocks a handler: it hands the report to the event loop, and this
duty writes the latest report of each job on the database thread (extending its lease too).
"""

from __future__ import annotations

import asyncio
import logging
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlqueue._context import JobContext, JobDatabase
from sqlqueue._errors import DatabaseError
from sqlqueue._store.rows import ClaimedJob, progress_entry
from sqlqueue._worker.dbthread import DatabaseThread

if TYPE_CHECKING:
    from sqlqueue._store.store import Store

__all__ = ["Contexts"]

log = logging.getLogger("sqlqueue.worker")


class Contexts:
    """Creates, tracks and cancels :class:`JobContext` objects; writes their progress."""

    def __init__(
        self,
        database: JobDatabase,
        store: Store,
        *,
        lease_seconds: float,
        worker_id: str,
        db: DatabaseThread,
    ) -> None:
        """Contexts on ``database`` (what a handler's context may use of the queue); their
        progress written through ``store``, extending each job's lease to ``lease_seconds``."""
        self._database = database
        self._store = store
        self._lease_seconds = lease_seconds
        self._worker_id = worker_id
        self._db = db
        self._loop = asyncio.get_running_loop()
        self._live: dict[int, tuple[ClaimedJob, JobContext]] = {}
        self._dirty: dict[int, tuple[ClaimedJob, JobContext]] = {}
        self._ready = asyncio.Event()
        self._cancelled = False

    def make(self, job: ClaimedJob) -> JobContext:
        """A context for ``job``, registered until :meth:`forget`."""
        context = JobContext(
            job, self._database, worker_id=self._worker_id, on_progress=self._report_threadsafe
        )
        if self._cancelled:
            context.cancel()
        self._live[job.id] = (job, context)
        return context

    def forget(self, job: ClaimedJob) -> None:
        """Stop tracking ``job``'s context (its attempt is over)."""
        self._live.pop(job.id, None)

    def cancel(self, job_id: int) -> None:
        """Tell the handler of ``job_id`` that its job was cancelled."""
        entry = self._live.get(job_id)
        if entry is not None:
            entry[1].cancel()

    def cancel_all(self) -> None:
        """Tell every running handler (and any started later) that it should stop."""
        self._cancelled = True
        for _, context in self._live.values():
            context.cancel()

    def _report_threadsafe(self, context: JobContext) -> None:
        self._loop.call_soon_threadsafe(self._report, context.job_id)

    def _report(self, job_id: int) -> None:
        entry = self._live.get(job_id)
        if entry is not None:
            self._dirty[job_id] = entry
            self._ready.set()

    async def run(self) -> None:
        """Write progress reports as they come, batching those that arrive meanwhile."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            batch, self._dirty = self._dirty, {}
            reports: list[tuple[tuple[int, int], dict[str, Any]]] = []
            for job, context in batch.values():
                progress = context.take_progress()
                if progress is not None:
                    reports.append((job.fence, progress_entry(**progress)))
            if not reports:
                continue
            try:
                await self._db.call(partial(self._write, reports))
            except DatabaseError as error:
                log.warning("could not record progress of %d job(s): %s", len(reports), error)

    def _write(self, reports: list[tuple[tuple[int, int], dict[str, Any]]]) -> set[int]:
        return self._store.record_progress(
            worker_id=self._worker_id, reports=reports, lease_seconds=self._lease_seconds
        )
