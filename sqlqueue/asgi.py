"""A worker inside an ASGI app's process (FastAPI, Starlette, …), for small deployments.

``lifespan(queue, queues=[…], concurrency=N)`` is an async context manager to enter in the
app's lifespan: a :class:`~sqlqueue.Worker` serves on the app's event loop while the app runs,
and on shutdown stops claiming and lets its in-flight jobs finish (up to ``shutdown_timeout``,
then they are released to the queue without burning an attempt), as a worker process does on
SIGTERM. It is also the lifespan itself: ``FastAPI(lifespan=sqlqueue.asgi.lifespan(queue))``.

Sync handlers run on the worker's threads; async handlers share the app's event loop, so one
that blocks it stalls the app's requests too. When jobs are heavy, or the app runs in many
processes (each would run a worker), run ``sqlqueue worker`` processes instead.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from sqlqueue._errors import ConfigurationError
from sqlqueue._queue import Queue
from sqlqueue._worker.loop import Worker

__all__ = ["Lifespan", "lifespan"]

log = logging.getLogger("sqlqueue.asgi")


class Lifespan:
    """A worker for the life of an app: enter it (``async with``) around the app's lifespan,
    or hand it to the framework as the lifespan (each run of the app gets a worker of its
    own). While entered, :attr:`worker` is the running worker, also in the app's state."""

    def __init__(self, queue: Queue, worker_options: Mapping[str, Any]) -> None:
        self.queue = queue
        self.worker_options = dict(worker_options)
        self.worker: Worker | None = None
        self._serving: asyncio.Task[None] | None = None

    def __call__(self, app: object) -> Lifespan:
        """The lifespan of one run of ``app`` (what FastAPI and Starlette call)."""
        return Lifespan(self.queue, self.worker_options)

    async def __aenter__(self) -> dict[str, Worker]:
        """Start the worker; the app's lifespan state gets it as ``sqlqueue_worker`` (in a
        request: ``request.state.sqlqueue_worker``)."""
        if self._serving is not None:
            raise ConfigurationError("this lifespan is running already: enter a new one")
        worker = self.queue.worker(**self.worker_options)
        serving = asyncio.create_task(worker.serve(), name="sqlqueue-worker")
        await asyncio.sleep(0)  # let it start: a queue with no task fails here, at start-up
        if serving.done():
            serving.result()
        serving.add_done_callback(_report_end)
        self.worker, self._serving = worker, serving
        return {"sqlqueue_worker": worker}

    async def __aexit__(
        self,
        error_type: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        worker, serving = self.worker, self._serving
        self.worker, self._serving = None, None
        if worker is None or serving is None:
            return
        worker.stop()
        await serving


def _report_end(serving: asyncio.Task[None]) -> None:
    """Say so when the worker stops on its own (the database gone for good at start-up, a
    bug): the app keeps serving requests, but nothing runs its jobs any more."""
    if not serving.cancelled() and serving.exception() is not None:
        log.error("the app's sqlqueue worker stopped: %s", serving.exception())


def lifespan(
    queue: Queue,
    *,
    queues: Sequence[str] | Mapping[str, int] | None = None,
    concurrency: int = 4,
    **worker_options: Any,
) -> Lifespan:
    """A worker of ``queue`` in the app's process for as long as the app runs.

    ``queues`` and ``concurrency`` (and ``worker_options``: ``poll_interval``,
    ``shutdown_timeout``, ``listen`` …) are those of :meth:`~sqlqueue.Queue.worker`."""
    if not isinstance(queue, Queue):
        raise ConfigurationError(f"queue: expected a sqlqueue.Queue, got {queue!r}")
    unknown = sorted(set(worker_options) - set(inspect.signature(Queue.worker).parameters))
    if unknown:
        raise ConfigurationError(f"unknown worker option: {unknown[0]} (see Queue.worker)")
    return Lifespan(queue, {"queues": queues, "concurrency": concurrency, **worker_options})
