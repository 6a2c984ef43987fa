"""The built-in ``metrics`` middleware: a worker that serves Prometheus metrics counts each
handler call as it begins, shows it running until it ends, and times it — sync and async
handlers, with the app's middleware inside it — and the step is in the tasks' plans only while
such a worker runs (a worker without metrics pays nothing per job)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

import sqlqueue
from tests._support import WorkerThread, wait_until
from tests.conftest import Backend
from tests.test_metrics import scrape, value

pytestmark = pytest.mark.timeout(120)


def test_calls_are_counted_as_they_begin_shown_running_and_timed(backend: Backend) -> None:
    queue = backend.queue()
    release = threading.Event()
    seen: list[str] = []

    @queue.middleware
    async def app_middleware(job: sqlqueue.Job, call_next: Callable[[], Any]) -> Any:
        seen.append(job.job_type)
        return await call_next()

    @queue.task("blocks")
    def blocks() -> None:
        release.wait(30)

    @queue.task("blocks_async")
    async def blocks_async() -> None:
        while not release.is_set():
            await asyncio.sleep(0.01)

    with backend.engine.begin() as conn:
        queue.enqueue(conn, "blocks")
        queue.enqueue(conn, "blocks_async")
    worker = queue.worker(metrics_port=0, poll_interval=0.05, concurrency=2)
    with WorkerThread(worker):
        port = wait_until(lambda: worker.metrics_port, what="the metrics endpoint")
        assert "metrics" in queue.tasks["blocks"].plan.steps

        def running(found: dict[Any, float]) -> list[float]:
            return [
                value(found, "sqlqueue_attempts_in_progress", queue="default", job_type=name)
                for name in ("blocks", "blocks_async")
            ]

        def scraped_when(wanted: list[float]) -> Callable[[], dict[Any, float] | None]:
            def probe() -> dict[Any, float] | None:
                found = scrape(port)
                return found if running(found) == wanted else None

            return probe

        during = wait_until(scraped_when([1, 1]), what="both calls running")
        release.set()
        after = wait_until(scraped_when([0, 0]), what="both calls ended")
    for name in ("blocks", "blocks_async"):
        labels = {"queue": "default", "job_type": name}
        assert value(during, "sqlqueue_attempts_started_total", **labels) == 1
        assert value(during, "sqlqueue_handler_duration_seconds_count", **labels) == 0
        assert value(after, "sqlqueue_attempts_started_total", **labels) == 1
        assert value(after, "sqlqueue_handler_duration_seconds_count", **labels) == 1
    assert sorted(seen) == ["blocks", "blocks_async"]  # the app's middleware ran inside it
    # The worker stopped: the step left the plans with its meter.
    assert "metrics" not in queue.tasks["blocks"].plan.steps


def test_a_worker_without_metrics_gets_no_metrics_step(backend: Backend) -> None:
    queue = backend.queue()
    ran: list[int] = []
    queue.task("noop")(lambda: ran.append(1))
    with backend.engine.begin() as conn:
        queue.enqueue(conn, "noop")
    worker = queue.worker(poll_interval=0.05)
    with WorkerThread(worker):
        wait_until(lambda: ran, what="the job to run")
        assert "metrics" not in queue.tasks["noop"].plan.steps
