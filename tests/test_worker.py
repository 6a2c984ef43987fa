"""The worker in-process: sync and async handlers, slots, heartbeats."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from datetime import datetime

import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import jobs
from sqlqueue._worker import slots
from tests._support import WorkerThread, db_now, drain, wait_until


def test_sync_handlers_run_in_threads_and_async_handlers_on_the_loop(backend):
    queue = backend.queue()
    seen: dict[str, str] = {}

    @queue.task("sync")
    def sync_handler() -> None:
        seen["sync"] = threading.current_thread().name

    @queue.task("async")
    async def async_handler() -> None:
        asyncio.get_running_loop()
        seen["async"] = threading.current_thread().name
        await asyncio.sleep(0)

    with backend.engine.begin() as conn:
        a = sync_handler.enqueue(conn)
        b = async_handler.enqueue(conn)
    caller = threading.current_thread().name
    drain(queue)
    assert seen["sync"].startswith("sqlqueue-handler")
    assert seen["async"] == caller  # the worker's event loop runs in the calling thread
    assert queue.get_job(a).status == queue.get_job(b).status == "succeeded"


def test_a_worker_never_runs_more_jobs_than_its_concurrency(backend):
    queue = backend.queue()
    running = 0
    peak = 0
    lock = threading.Lock()

    @queue.task("slow")
    def slow() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1

    @queue.task("aslow")
    async def aslow() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        await asyncio.sleep(0.05)
        with lock:
            running -= 1

    with backend.engine.begin() as conn:
        slow.enqueue_many(conn, [{} for _ in range(20)])
        aslow.enqueue_many(conn, [{} for _ in range(20)])
    drain(queue, concurrency=3)
    assert peak == 3
    with backend.engine.connect() as conn:
        statuses = conn.exec_driver_sql("SELECT DISTINCT status FROM sqlqueue_jobs").scalars()
        assert list(statuses) == ["succeeded"]


def test_heartbeats_keep_a_job_longer_than_its_lease_alive(backend):
    # A beat every 0.5 s (a third of the lease) through a job of 2.7 leases. A 0.6 s lease left
    # 0.4 s of slack, which one slow heartbeat commit on a loaded CI machine used up.
    queue = backend.queue(lease_seconds=1.5)
    runs: list[float] = []

    @queue.task("long")
    def long_job() -> None:
        runs.append(time.monotonic())
        time.sleep(4.0)

    with backend.engine.begin() as conn:
        job_id = long_job.enqueue(conn)
    # A second worker with an eager reaper runs alongside and must not take the job.
    rival = sqlqueue.Queue(backend.engine, lease_seconds=1.5)
    rival.task("long")(long_job.handler)
    with WorkerThread(rival.worker(poll_interval=0.05, reaper_interval=0.1)):
        drain(queue, poll_interval=0.05)
        wait_until(lambda: queue.get_job(job_id).status == "succeeded")
    job = queue.get_job(job_id)
    assert (job.status, job.attempts, job.errors) == ("succeeded", 1, ())
    assert len(runs) == 1


def test_stop_lets_a_short_job_finish_and_releases_a_long_one(backend):
    queue = backend.queue()
    started = threading.Event()

    @queue.task("short")
    async def short() -> None:
        started.set()
        await asyncio.sleep(0.3)

    @queue.task("endless")
    async def endless() -> None:
        await asyncio.sleep(3600)

    with backend.engine.begin() as conn:
        quick = short.enqueue(conn)
        stuck = endless.enqueue(conn)
    worker = queue.worker(concurrency=2, poll_interval=0.05, shutdown_timeout=1.0)
    with WorkerThread(worker) as running:
        assert started.wait(10)
        wait_until(lambda: queue.get_job(stuck).status == "running")
        running.stop()
    assert queue.get_job(quick).status == "succeeded"
    job = queue.get_job(stuck)
    assert (job.status, job.attempts, job.locked_by) == ("queued", 0, None)


def test_a_pool_of_quick_jobs_holds_one_job_ahead_and_releases_it_at_shutdown(backend, monkeypatch):
    """Quick jobs make a pool claim a batch ahead of its free slots: the held job is leased
    (``running`` in the table) but not started while the slot is taken, and a shutdown gives
    it back without using an attempt."""
    monkeypatch.setattr(slots, "QUICK_SECONDS", 3600.0)  # every job counts as quick here
    monkeypatch.setattr(slots, "HOLD_SECONDS", 3600.0)  # and a held job waits as long as needed
    queue = backend.queue()
    ran: list[str] = []
    blocked = threading.Event()

    @queue.task("quick")
    async def quick(name: str) -> None:
        ran.append(name)

    @queue.task("endless")
    async def endless() -> None:
        blocked.set()
        await asyncio.sleep(3600)

    with backend.engine.begin() as conn:
        first = quick.enqueue(conn, name="first")
        stuck = endless.enqueue(conn)
        held = quick.enqueue(conn, name="held")
        behind = quick.enqueue(conn, name="behind")
    worker = queue.worker(concurrency=1, poll_interval=0.05, shutdown_timeout=0.5)
    with WorkerThread(worker) as running:
        assert blocked.wait(10)
        wait_until(lambda: queue.get_job(held).status == "running")
        assert queue.get_job(behind).status == "queued"  # one batch ahead, no more
        running.stop()
    # The held job never started while the slot was taken, up to the stop and after it.
    assert ran == ["first"]
    assert queue.get_job(first).status == "succeeded"
    for job_id in (stuck, held):
        job = queue.get_job(job_id)
        assert (job.status, job.attempts, job.locked_by) == ("queued", 0, None)


def test_ctx_now_of_a_job_held_ahead_counts_the_time_it_was_held(backend, monkeypatch):
    """``ctx.now()`` reads the database clock without a round trip: the claim's time plus
    what this process counted since the claim. A job claimed ahead and held behind a slow one
    for a second and a half still reads the clock right when it starts, not 1.5 s behind."""
    monkeypatch.setattr(slots, "QUICK_SECONDS", 3600.0)  # every job counts as quick here
    monkeypatch.setattr(slots, "HOLD_SECONDS", 3600.0)  # and a held job waits as long as needed
    queue = backend.queue()
    seen: list[tuple[datetime, datetime]] = []
    blocked, release = threading.Event(), threading.Event()

    @queue.task("quick")
    def quick(name: str, ctx: sqlqueue.JobContext) -> None:
        if name == "held":
            seen.append((ctx.now(), db_now(backend.engine)))

    @queue.task("blocker")
    async def blocker() -> None:
        blocked.set()
        await asyncio.to_thread(release.wait, 30)

    with backend.engine.begin() as conn:
        quick.enqueue(conn, name="first")
        blocker.enqueue(conn)
        held = quick.enqueue(conn, name="held")
    with WorkerThread(queue.worker(concurrency=1, poll_interval=0.05, shutdown_timeout=2)):
        assert blocked.wait(10)
        wait_until(lambda: queue.get_job(held).attempts == 1)  # claimed ahead, held
        time.sleep(1.5)  # the held time that ctx.now() must count
        release.set()
        wait_until(lambda: queue.get_job(held).status == "succeeded")
    [(said, clock)] = seen
    # Read just before the clock: behind it by a round trip, never by the 1.5 s held.
    assert -0.25 < (clock - said).total_seconds() < 1.25, (said, clock)


def test_a_pool_of_slow_jobs_claims_no_more_than_its_free_slots(backend):
    """Jobs slower than a few round trips are never held ahead: a job waiting behind a long
    one stays in the queue, where another worker can take it."""
    queue = backend.queue()
    started: list[int] = []
    # Every job takes 0.3 s at least; the second then runs until the test has looked (on a
    # loaded machine the look may come later than 0.3 s after it started).
    done = [threading.Event() for _ in range(3)]
    done[0].set()
    done[2].set()

    @queue.task("slow")
    def slow(n: int) -> None:
        started.append(n)
        time.sleep(0.3)
        done[n].wait(30)

    with backend.engine.begin() as conn:
        ids = [slow.enqueue(conn, n=n) for n in range(3)]
    worker = queue.worker(concurrency=1, poll_interval=0.02)
    with WorkerThread(worker):
        wait_until(lambda: len(started) == 2)
        assert queue.get_job(ids[1]).status == "running"
        assert queue.get_job(ids[2]).status == "queued"
        done[1].set()
        wait_until(lambda: len(started) == 3)


class _Held:
    """A quick job ("first"), a blocker that takes the pool's one slot until ``release`` is
    set, and a quick job ("held") claimed ahead behind it; ``ran`` is (name, attempt) per run."""

    def __init__(self, backend, queue: sqlqueue.Queue) -> None:
        self.ran: list[tuple[str, int]] = []
        self.blocked, self.release = threading.Event(), threading.Event()

        @queue.task("quick")
        async def quick(name: str, ctx: sqlqueue.JobContext) -> None:
            self.ran.append((name, ctx.attempt))

        @queue.task("blocker")
        async def blocker() -> None:
            self.blocked.set()
            await asyncio.to_thread(self.release.wait, 30)

        with backend.engine.begin() as conn:
            quick.enqueue(conn, name="first")
            blocker.enqueue(conn)
            self.held = quick.enqueue(conn, name="held")


def test_a_held_job_whose_lease_was_lost_is_never_started(backend, monkeypatch):
    """A job held ahead is leased like a running one: if its lease is lost (reaped while the
    slot was taken), the worker drops it instead of starting that stale attempt later; the job
    runs once, as the new attempt its next claim makes."""
    monkeypatch.setattr(slots, "QUICK_SECONDS", 3600.0)  # every job counts as quick here
    monkeypatch.setattr(slots, "HOLD_SECONDS", 3600.0)  # and a held job waits as long as needed
    queue = backend.queue(lease_seconds=1.5)  # a heartbeat every 0.5 s
    scene = _Held(backend, queue)
    held, blocked, release, ran = scene.held, scene.blocked, scene.release, scene.ran
    worker = queue.worker(concurrency=1, poll_interval=0.05, shutdown_timeout=2)
    with WorkerThread(worker):
        assert blocked.wait(10)
        wait_until(lambda: queue.get_job(held).attempts == 1)
        with backend.engine.begin() as conn:  # what the reaper does to an expired lease
            conn.execute(
                sa.update(jobs)
                .where(jobs.c.id == held)
                .values(status="queued", locked_by=None, lease_expires_at=None)
            )
        wait_until(lambda: queue.get_job(held).attempts == 2)  # dropped, then claimed again
        release.set()
        wait_until(lambda: queue.get_job(held).status == "succeeded")
    assert ran == [("first", 1), ("held", 2)]


def test_a_job_held_behind_slow_jobs_goes_back_to_the_queue_for_another_worker(
    backend, monkeypatch, caplog
):
    """Quick jobs made the pool claim ahead, then a slow one took its only slot: after
    ``HOLD_SECONDS`` without starting it, the worker gives the held job back (queued, no
    attempt used) and claims no more ahead, so an idle worker runs it meanwhile."""
    # "first" (an empty coroutine) is quick with a margin of a second on a busy machine; the
    # blocker, held past HOLD_SECONDS, makes the pool's average slow.
    monkeypatch.setattr(slots, "QUICK_SECONDS", 1.0)
    monkeypatch.setattr(slots, "HOLD_SECONDS", 1.2)
    caplog.set_level(logging.INFO, logger="sqlqueue")
    queue = backend.queue()
    scene = _Held(backend, queue)
    held, blocked, release, ran = scene.held, scene.blocked, scene.release, scene.ran
    busy = queue.worker(concurrency=1, poll_interval=0.05, shutdown_timeout=2)
    with WorkerThread(busy):
        assert blocked.wait(10)
        wait_until(lambda: queue.get_job(held).attempts == 1)  # claimed ahead, held
        wait_until(lambda: queue.get_job(held).status == "queued", timeout=5)
        job = queue.get_job(held)
        assert (job.attempts, job.locked_by) == (0, None), "given back without an attempt"
        with WorkerThread(queue.worker(concurrency=1, poll_interval=0.05)):
            wait_until(lambda: queue.get_job(held).status == "succeeded")
        assert ran == [("first", 1), ("held", 1)]
        release.set()
    # No more claiming ahead: the busy worker never claimed the job again (it would have had
    # to hold it, and give it back once more, for the other worker to run it).
    gave_back = [r for r in caplog.records if "claimed ahead back to the queue" in r.getMessage()]
    assert len(gave_back) == 1
