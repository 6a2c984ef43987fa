"""Concurrency limits on every backend: a task's ``Concurrency`` (in total and per key) and a
queue's ``max_running``. The claim skips what cannot run (nothing is claimed and released), and
concurrent claimers together never lease beyond a limit. Worker processes and a SIGKILL are in
tests/test_concurrency_limits_processes.py."""

from __future__ import annotations

import os
import tempfile
import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import sqlqueue
from sqlqueue._store.limited_claim import ClaimLimits
from tests._support import count_jobs, drain, run_cli

LEASE = 30.0
_NOWHERE = tempfile.mkdtemp(prefix="sqlqueue-limits-")


def _limits(queue: sqlqueue.Queue, queues: dict[str, int] | None = None) -> ClaimLimits:
    """The limits a worker of ``queue`` obeys: its tasks' ``Concurrency`` limits, and the
    queues' limits as it read them (``queues``)."""
    tasks = {
        name: task.concurrency.limit
        for name, task in queue.tasks.items()
        if task.concurrency is not None
    }
    return ClaimLimits(tasks=tasks, queues=queues or {})


def _claim(
    queue: sqlqueue.Queue,
    worker: str = "w",
    limit: int = 50,
    queues: dict[str, int] | None = None,
) -> list[Any]:
    return queue.store.claim(
        queues=["default"],
        job_types=None,
        limit=limit,
        worker_id=worker,
        lease_seconds=LEASE,
        limits=_limits(queue, queues),
    )


def _finish(queue: sqlqueue.Queue, jobs: list[Any], worker: str = "w") -> None:
    queue.store.cycle(
        worker_id=worker,
        succeeded=[(job.id, job.attempt) for job in jobs],
        failures=(),
        results=None,
        claims=(),
        job_types=None,
        lease_seconds=LEASE,
    )


def test_a_task_limit_is_never_exceeded_and_a_finished_job_frees_its_slot(backend):
    queue = backend.queue()
    queue.task("limited", concurrency=sqlqueue.Concurrency(limit=3))(lambda n: None)
    queue.task("free")(lambda n: None)
    with backend.engine.begin() as conn:
        for n in range(10):
            queue.enqueue(conn, "limited", {"n": n})
        for n in range(4):
            queue.enqueue(conn, "free", {"n": n})
    first = _claim(queue, "w1")
    assert sorted(job.job_type for job in first) == ["free"] * 4 + ["limited"] * 3
    # Another worker finds nothing: the limited jobs are skipped, not claimed and released.
    assert _claim(queue, "w2") == []
    assert count_jobs(backend.engine, status="running") == 7
    _finish(queue, [job for job in first if job.job_type == "limited"][:2], "w1")
    again = _claim(queue, "w2")
    assert [job.job_type for job in again] == ["limited", "limited"]
    assert _claim(queue, "w3") == []


def test_a_per_key_limit_holds_for_each_key(backend):
    queue = backend.queue()
    queue.task(
        "sync", concurrency=sqlqueue.Concurrency(limit=2, key=lambda p: f"tenant:{p['tenant']}")
    )(lambda tenant, n: None)
    with backend.engine.begin() as conn:
        for n in range(5):
            for tenant in ("a", "b", "c"):
                queue.enqueue(conn, "sync", {"tenant": tenant, "n": n})
    claimed = _claim(queue)
    by_key: dict[str, int] = {}
    for job in claimed:
        key = queue.get_job(job.id).payload["tenant"]
        by_key[key] = by_key.get(key, 0) + 1
    assert by_key == {"a": 2, "b": 2, "c": 2}
    assert _claim(queue, "other") == []


def test_concurrent_claimers_together_stay_within_the_limit(backend):
    """Eight claimers at once, each asking for five: the snapshot race (each sees room for three
    and takes three) would lease up to 24; the key's lock makes it exactly three."""
    queue = backend.queue()
    queue.task("limited", concurrency=sqlqueue.Concurrency(limit=3))(lambda n: None)
    with backend.engine.begin() as conn:
        for n in range(40):
            queue.enqueue(conn, "limited", {"n": n})
    barrier = threading.Barrier(8)
    taken: list[int] = []
    errors: list[BaseException] = []

    def claimer(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            jobs = _claim(queue, f"w{index}", limit=5)
            taken.extend(job.id for job in jobs)
        except BaseException as error:  # reported below, with the thread's failure
            errors.append(error)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert len(taken) == len(set(taken)) == 3
    assert count_jobs(backend.engine, status="running") == 3


def test_limited_jobs_all_run_through_a_worker(backend):
    queue = backend.queue()
    lock = threading.Lock()
    running = [0]
    most = [0]

    @queue.task("limited", concurrency=sqlqueue.Concurrency(limit=2, key=lambda p: p["k"]))
    def limited(k: str, n: int) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        with lock:
            running[0] -= 1

    with backend.engine.begin() as conn:
        for n in range(6):
            limited.enqueue(conn, k="only", n=n)
    drain(queue, concurrency=6)
    assert count_jobs(backend.engine, status="succeeded") == 6
    assert most[0] <= 2


def test_a_queue_limit_is_set_read_in_stats_and_lifted(backend):
    queue = backend.queue()
    queue.task("t")(lambda n: None)
    with backend.engine.begin() as conn:
        for n in range(6):
            queue.enqueue(conn, "t", {"n": n})
    queue.set_queue_limit("default", 2)
    assert queue.stats().queues["default"].max_running == 2
    assert queue.stats().to_dict()["queues"]["default"]["max_running"] == 2
    # Workers read the limit with the pauses, every poll interval.
    read = dict(queue.admin.queue_controls()[1])
    assert len(_claim(queue, "w1", queues=read)) == 2
    assert _claim(queue, "w2", queues=read) == []
    # Lowered under the running count: nothing more until enough of them finish.
    queue.set_queue_limit("default", 1)
    assert _claim(queue, "w3", queues=read) == []
    queue.set_queue_limit("default", None)
    assert queue.stats().queues["default"].max_running is None
    assert len(_claim(queue, "w4", queues=dict(queue.admin.queue_controls()[1]))) == 4


def test_a_queue_limit_changed_at_runtime_is_obeyed_by_a_worker(backend):
    queue = backend.queue()
    lock = threading.Lock()
    running = [0]
    most = [0]

    @queue.task("t")
    def t(n: int) -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        threading.Event().wait(0.02)
        with lock:
            running[0] -= 1

    with backend.engine.begin() as conn:
        for n in range(12):
            t.enqueue(conn, n=n)
    queue.set_queue_limit("default", 1)
    drain(queue, concurrency=4)
    assert count_jobs(backend.engine, status="succeeded") == 12
    assert most[0] == 1


def test_the_cli_sets_shows_and_lifts_a_queue_limit(backend):
    result = run_cli("limit", "mail", "3", url=backend.url)
    assert result.returncode == 0, result.stderr
    assert "at most 3" in result.stdout
    shown = run_cli("stats", url=backend.url)
    assert "limit" in shown.stdout
    assert "mail" in shown.stdout
    result = run_cli("limit", "mail", "none", url=backend.url)
    assert result.returncode == 0, result.stderr
    assert "mail" not in backend.queue().stats().queues  # no jobs, no limit: not listed
    bad = run_cli("limit", "mail", "0", url=backend.url)
    assert bad.returncode != 0
    assert "set_queue_limit: limit must be an int of 1.." in bad.stderr


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "3", None, 2**31])
def test_a_bad_limit_is_refused_at_declaration(limit):
    with pytest.raises(sqlqueue.ConfigurationError, match=r"Concurrency\.limit must be an int"):
        sqlqueue.Concurrency(limit=limit)


def test_a_key_that_is_not_a_function_is_refused():
    with pytest.raises(sqlqueue.ConfigurationError, match=r"Concurrency\.key must be a function"):
        sqlqueue.Concurrency(limit=1, key="tenant")  # type: ignore[arg-type]


def test_concurrency_must_be_a_concurrency(backend):
    queue = backend.queue()
    with pytest.raises(sqlqueue.ConfigurationError, match="concurrency must be a sqlqueue"):
        queue.task("t", concurrency=3)(lambda: None)


@pytest.mark.parametrize(
    ("key", "message"),
    [
        (lambda p: 42, "Concurrency.key returned 42"),
        (lambda p: "", "Concurrency.key returned ''"),
        (lambda p: "x" * 256, "string of 1..255"),
        (lambda p: p["missing"], "Concurrency.key raised KeyError"),
        (lambda p: "a\x00b", "Concurrency.key"),
    ],
)
def test_a_bad_key_is_an_enqueue_error_and_writes_nothing(backend, key, message):
    queue = backend.queue()
    queue.task("t", concurrency=sqlqueue.Concurrency(limit=1, key=key))(lambda **_: None)
    with pytest.raises(sqlqueue.EnqueueError, match=message), backend.engine.begin() as conn:
        queue.enqueue(conn, "t", {"n": 1})
    assert count_jobs(backend.engine) == 0


@given(
    limit=st.one_of(
        st.integers(max_value=0),
        st.integers(min_value=2**31),
        st.floats(),
        st.text(max_size=5),
        st.booleans(),
    )
)
def test_set_queue_limit_refuses_anything_but_a_positive_int(limit):
    # Refused before any SQL: the database file is never even created.
    queue = sqlqueue.Queue(f"sqlite:///{_NOWHERE}/never.db")
    with pytest.raises(sqlqueue.ConfigurationError, match="set_queue_limit: limit"):
        queue.set_queue_limit("default", limit)
    assert os.listdir(_NOWHERE) == []
