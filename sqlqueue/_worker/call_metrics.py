"""The built-in ``metrics`` middleware: what a worker's Prometheus metrics say about the handler
call itself — calls begun, calls running now, and how long each took — measured around it,
composed like the app's middleware (sqlqueue/_middleware.py).

What is about the outcome stays where the outcome is written (sqlqueue/_worker/observe.py):
``sqlqueue_jobs_total`` counts an attempt once its outcome is classified and stored, and its
duration and wait histograms observe the same attempts. A call is begun before that, and some
calls never get an outcome of their own (a worker stopped meanwhile), so calls and outcomes are
counted apart.

A worker that serves metrics registers its :class:`CallMeter` with its queue's middleware
(:meth:`sqlqueue._middleware.Middlewares.meter`) and the tasks are planned again: the step is in
a plan only while some worker of the queue serves metrics, so a worker without them pays
nothing per job. Each call finds its own worker's meter by the worker current on its thread or
task (two workers of one queue in one process keep their counts apart).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from sqlqueue._logs import current_worker
from sqlqueue._middleware import compose

if TYPE_CHECKING:
    from sqlqueue._store.rows import ClaimedJob
    from sqlqueue._task import Task

__all__ = ["CallMeter", "metrics_step", "metrics_wanted"]


class CallMeter(Protocol):
    """One worker's meter of handler calls."""

    def begin(self, job: ClaimedJob) -> float:
        """A call of ``job``'s handler begins; return what :meth:`end` needs (its start)."""
        ...

    def end(self, job: ClaimedJob, began: float) -> None:
        """That call returned or raised."""
        ...


def metrics_wanted(task: Task) -> bool:
    """Whether some worker of ``task``'s queue serves metrics now."""
    return task.middlewares is not None and bool(task.middlewares.meters)


def metrics_step(task: Task, call: Callable[[ClaimedJob, dict[str, Any]], Any]) -> Any:
    """The ``metrics`` step of sqlqueue/_worker/pipeline.py: the current worker's meter around
    the call (the app's middleware and the handler)."""
    assert task.middlewares is not None  # wanted only by tasks of a queue with meters
    meters = task.middlewares.meters

    async def metered_async(job: ClaimedJob, call_next: Callable[[], Any]) -> Any:
        meter = meters.get(current_worker.get())
        if meter is None:  # a worker of this queue that does not serve metrics
            return await call_next()
        began = meter.begin(job)
        try:
            return await call_next()
        finally:
            meter.end(job, began)

    def metered_sync(job: ClaimedJob, call_next: Callable[[], Any]) -> Any:
        meter = meters.get(current_worker.get())
        if meter is None:
            return call_next()
        began = meter.begin(job)
        try:
            return call_next()
        finally:
            meter.end(job, began)

    middleware = metered_async if task.is_async else metered_sync
    return compose((middleware,), call, is_async=task.is_async, view=_claimed)


def _claimed(job: ClaimedJob) -> ClaimedJob:
    return job
