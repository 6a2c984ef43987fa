"""Starting a claimed job by the route its task's plan chose when the task was made: a direct
plan straight on a handler thread (:func:`~sqlqueue._worker.attempt.start_direct`), anything else
in an asyncio task of its own through :func:`~sqlqueue._worker.attempt.execute`.

Either way the worker gets one future per running job (the task, or the thread ticket's
future): it cancels that future to give up on the job at shutdown, and hears of its end
through ``ended`` once the outcome has gone to the completer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from sqlqueue._store.rows import ClaimedJob
from sqlqueue._task import Task
from sqlqueue._worker.attempt import Runtime, execute, start_direct
from sqlqueue._worker.classify import classify
from sqlqueue._worker.outbox import Completer
from sqlqueue._worker.threads import Ticket

__all__ = ["Launcher"]

log = logging.getLogger("sqlqueue.worker")


class Launcher:
    """Runs claimed jobs on a worker's runtime and hands each outcome to its completer."""

    def __init__(
        self,
        tasks: Mapping[str, Task],
        runtime: Runtime,
        completer: Completer,
        *,
        ended: Callable[[ClaimedJob, asyncio.Future[Any]], None],
    ) -> None:
        self._tasks = tasks
        self._runtime = runtime
        self._completer = completer
        self._ended = ended

    def launch(self, job: ClaimedJob) -> asyncio.Future[Any]:
        """Start ``job``; the future stands for it while it runs."""
        task = self._tasks.get(job.job_type)
        if task is not None and task.plan.direct:
            try:
                ticket = start_direct(job, task, self._runtime)
            except Exception:  # never leave a taken slot without a job: the task route reports
                log.exception("could not start job %d on a handler thread directly", job.id)
            else:
                ticket.future.add_done_callback(partial(self._direct_done, job, task, ticket))
                return ticket.future
        return asyncio.create_task(self._process(job, task), name=f"sqlqueue-job-{job.id}")

    def _direct_done(
        self, job: ClaimedJob, task: Task, ticket: Ticket, future: asyncio.Future[Any]
    ) -> None:
        """A job started by :func:`start_direct` ended: hand over its outcome."""
        try:
            if future.cancelled():  # shutdown gave up on it: stop the call, release the job
                self._runtime.threads.abandon(ticket)
            elif (error := future.exception()) is not None:  # deciding the outcome failed
                self._completer.add(classify(job, task, error, 0.0))
            else:
                self._completer.add(future.result())
        finally:
            self._ended(job, future)

    async def _process(self, job: ClaimedJob, task: Task | None) -> None:
        try:
            self._completer.add(await execute(job, task, self._runtime))
        finally:
            current = asyncio.current_task()
            assert current is not None
            self._ended(job, current)
