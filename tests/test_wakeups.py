"""PostgreSQL wake-ups: a worker polling once an hour still starts a new job at once, and
recovers its listening connection when it is killed.

The next poll is an hour away, far past the test, so a job that starts at all was started by a
wake-up: the test waits for the start (with a generous deadline) and prints how long it took.
"""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa

from tests._support import WorkerThread, wait_until
from tests._support.statements import claim_rounds

#: Far longer than the test: after the worker's first claim round, only a wake-up can start
#: a job while the test runs.
POLL_INTERVAL = 3600


def _started_within(event: threading.Event, enqueue, seconds: float) -> float:
    begun = time.monotonic()
    enqueue()
    assert event.wait(seconds), f"the job did not start within {seconds} s"
    return time.monotonic() - begun


def test_a_notification_wakes_an_idle_worker_at_once(backend):
    backend.requires("listen_notify")
    queue = backend.queue()
    started = threading.Event()

    @queue.task("ping")
    def ping() -> None:
        started.set()

    worker = queue.worker(poll_interval=POLL_INTERVAL)
    with claim_rounds(backend.engine) as rounds, WorkerThread(worker):
        wait_until(lambda: worker.listening, timeout=10)
        # The first poll is over: for an hour only a wake-up can start the job now.
        wait_until(lambda: rounds() >= 1, what="the worker's first claim round")
        latency = _started_within(started, lambda: ping.enqueue(backend.engine), 30)
    print(f"\n    [{backend.name}] pickup with a 1 h poll interval: {latency * 1000:.1f} ms")


def test_the_listener_recovers_when_its_connection_is_killed(backend):
    backend.requires("listen_notify")
    queue = backend.queue()
    started = threading.Event()

    @queue.task("ping")
    def ping() -> None:
        started.set()

    worker = queue.worker(poll_interval=POLL_INTERVAL)
    with claim_rounds(backend.engine) as rounds, WorkerThread(worker):
        wait_until(lambda: worker.listening, timeout=10)
        wait_until(lambda: rounds() >= 1, what="the worker's first claim round")
        with backend.engine.connect() as conn:
            killed = (
                conn.execute(
                    sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND query ILIKE 'LISTEN%'"
                    )
                )
                .scalars()
                .all()
            )
        assert killed == [True]
        wait_until(lambda: not worker.listening, timeout=10)
        wait_until(lambda: worker.listening, timeout=10)
        latency = _started_within(started, lambda: ping.enqueue(backend.engine), 30)
    print(f"\n    [{backend.name}] pickup after the listener reconnected: {latency * 1000:.1f} ms")
