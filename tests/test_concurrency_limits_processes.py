"""Concurrency limits across worker processes: 4 processes x 8 slots against a limit of 3 (and
of 2 per key for 50 keys). A sampler reads the running jobs from the database all along; the
ledger says when each attempt really ran. A SIGKILLed worker's slot comes back by its lease's
expiry."""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import jobs
from tests.apps.ledger import create_ledger, read_ledger
from tests.apps.processes import wait_until

APP = "tests.apps.limits_app:queue"
OPTIONS = ("--concurrency", "8", "--poll-interval", "0.05")
# Many worker processes at once: under pytest-xdist these modules share one group, so
# two of them never run at the same time on a 2-core machine (see docs/development.md).
pytestmark = pytest.mark.xdist_group("many_processes")


class Sampler:
    """Counts the running jobs of ``job_type`` (by limit key) until stopped; keeps the highest
    count seen for any key."""

    def __init__(self, engine: sa.Engine, job_type: str) -> None:
        self._engine, self._job_type = engine, job_type
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        query = (
            sa.select(sa.func.count())
            .where(jobs.c.job_type == self._job_type, jobs.c.status == "running")
            .group_by(jobs.c.limit_key)
        )
        while not self._stop.is_set():
            with self._engine.connect() as conn:
                counts = conn.execute(query).scalars().all()
            self.most = max([self.most, *counts])
            self._stop.wait(0.01)


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals that overlap at one instant."""
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    most = current = 0
    for _, step in events:
        current += step
        most = max(most, current)
    return most


def _succeeded(engine: sa.Engine, total: int) -> bool:
    with engine.connect() as conn:
        done = conn.execute(
            sa.select(sa.func.count()).where(jobs.c.status == "succeeded")
        ).scalar_one()
    return bool(done == total)


def test_a_limit_of_three_holds_across_processes_and_a_killed_workers_slot_comes_back(
    backend, workers
):
    create_ledger(backend.engine)
    producer: Any = sqlqueue.Queue(backend.engine)
    producer.task("limits.global", concurrency=sqlqueue.Concurrency(limit=3))(lambda **_: None)
    # The victim's slot comes back when its lease expires: short, so the test is quick, but
    # not 2 s, which a live worker's heartbeat missed at a load average of 30 on 2 cores (its
    # job was run again beside it: 4 at once in the ledger, never more than 3 in the table).
    started = [workers.start(*OPTIONS, app=APP, lease_seconds=6) for _ in range(4)]
    for worker in started:
        worker.wait_ready()
    total = 30
    with backend.engine.begin() as conn:
        ids = [
            producer.enqueue(
                conn,
                "limits.global",
                {"key": f"j{n}", "seconds": 0.1, **({"first_seconds": 60} if n == 0 else {})},
                idempotency_key=f"j{n}",
            )
            for n in range(total)
        ]
    with Sampler(backend.engine, "limits.global") as sampler:
        victim = wait_until(
            lambda: next(
                (
                    r
                    for r in read_ledger(backend.engine)
                    if r.job_id == ids[0] and r.finished is None
                ),
                None,
            ),
            timeout=30,
            what="the victim job to start",
        )
        killed = next(worker for worker in started if worker.pid == victim.pid)
        killed.send(signal.SIGKILL)
        killed_at = time.time()
        assert killed.wait(10) == -signal.SIGKILL
        wait_until(lambda: _succeeded(backend.engine, total), timeout=120, what="all jobs")
    ledger = read_ledger(backend.engine)
    at_once = _most_at_once(
        [(r.started, r.finished if r.finished is not None else killed_at) for r in ledger]
    )
    job = producer.get_job(ids[0])
    print(
        f"\n    [{backend.name}] {total} jobs, limit 3, 4 workers x 8 slots, one SIGKILLed: "
        f"at most {sampler.most} running (database), {at_once} at once (ledger)"
    )
    assert sampler.most == 3
    assert at_once <= 3
    # The victim's slot came back through its lease's expiry: it ran again and all finished.
    assert job.attempts == 2
    assert job.errors[-1].kind == "LeaseExpired"


def test_a_per_key_limit_holds_for_fifty_keys_across_processes(backend, workers):
    create_ledger(backend.engine)
    producer: Any = sqlqueue.Queue(backend.engine)
    producer.task(
        "limits.tenant", concurrency=sqlqueue.Concurrency(limit=2, key=lambda p: p["tenant"])
    )(lambda **_: None)
    started = [workers.start(*OPTIONS, app=APP) for _ in range(4)]
    for worker in started:
        worker.wait_ready()
    keys, per_key = 50, 4
    requests = [
        sqlqueue.JobRequest(
            job_type="limits.tenant",
            payload={"key": f"t{t}-{n}", "tenant": f"t{t}", "seconds": 0.05},
            idempotency_key=f"t{t}-{n}",
        )
        for n in range(per_key)
        for t in range(keys)
    ]
    with backend.engine.begin() as conn:
        ids = producer.enqueue_many(conn, requests)
    tenant_of = {job_id: r.payload["tenant"] for job_id, r in zip(ids, requests, strict=True)}
    with Sampler(backend.engine, "limits.tenant") as sampler:
        wait_until(lambda: _succeeded(backend.engine, keys * per_key), timeout=120, what="all jobs")
    by_tenant: dict[str, list[tuple[float, float]]] = {}
    for row in read_ledger(backend.engine):
        assert row.finished is not None
        by_tenant.setdefault(tenant_of[row.job_id], []).append((row.started, row.finished))
    at_once = Counter({t: _most_at_once(runs) for t, runs in by_tenant.items()})
    print(
        f"\n    [{backend.name}] {keys} keys x {per_key} jobs, limit 2 per key, 4 workers x 8: "
        f"at most {sampler.most} running per key (database), {max(at_once.values())} (ledger)"
    )
    assert len(by_tenant) == keys
    assert sampler.most <= 2
    assert max(at_once.values()) <= 2


@pytest.mark.interrupts_handler_threads
def test_a_timed_out_blocking_handler_keeps_its_limit_until_its_thread_returns(backend, workers):
    """Concurrency(limit=1), timeout 0.5 s, handlers blocking 1.5 s in a call no interrupt
    cuts short, 8 worker processes: never two at once, by the ledger or the table. Before,
    the slot was freed at the timeout while the thread slept on: 3 ran at once."""
    create_ledger(backend.engine)
    producer: Any = sqlqueue.Queue(backend.engine)
    producer.task("limits.blocking", max_attempts=1, concurrency=sqlqueue.Concurrency(limit=1))(
        lambda **_: None
    )
    started = [workers.start(*OPTIONS, app=APP) for _ in range(8)]
    for worker in started:
        worker.wait_ready()
    total = 4
    with backend.engine.begin() as conn:
        ids = [
            producer.enqueue(
                conn, "limits.blocking", {"key": f"b{n}", "seconds": 1.5}, idempotency_key=f"b{n}"
            )
            for n in range(total)
        ]
    with Sampler(backend.engine, "limits.blocking") as sampler:
        wait_until(
            lambda: all(_job(producer, job_id).status == "dead" for job_id in ids),
            timeout=120,
            what="every blocking job to time out",
        )

    # Every handler has returned (its finish is in the ledger), whenever its job ended.
    def returned() -> list[Any] | None:
        rows = read_ledger(backend.engine)
        finished = len(rows) == total and all(row.finished is not None for row in rows)
        return rows if finished else None

    ledger = wait_until(returned, timeout=60, what="every handler to return")
    at_once = _most_at_once([(row.started, row.finished) for row in ledger])
    print(
        f"\n    [{backend.name}] {total} jobs blocking 1.5 s past a 0.5 s timeout, limit 1, "
        f"8 workers: at most {sampler.most} running (database), {at_once} at once (ledger)"
    )
    assert (len(ledger), at_once, sampler.most) == (total, 1, 1)
    for job_id in ids:
        job = _job(producer, job_id)
        assert [error.kind for error in job.errors] == ["JobTimeout"], job.errors


def _job(queue: sqlqueue.Queue, job_id: int) -> sqlqueue.Job:
    job = queue.get_job(job_id)
    assert job is not None, job_id
    return job
