"""What a claim under concurrency limits costs in statements, on every backend: a claim's
latency is mostly its round trips (``sqlqueue/_store/limited_claim.py``). The walk over the
keys is one statement built once; a claim that finds every key full and no other job due runs
nothing else; the keys it does find are locked in one statement and counted in another, however
many there are. The limits themselves are tested in tests/test_concurrency_limits.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

import sqlqueue
from sqlqueue._store.limited_claim import ClaimLimits
from tests.conftest import Backend

LIMITS = ClaimLimits(tasks={"sync": 1})


def _queue(backend: Backend) -> sqlqueue.Queue:
    queue = backend.queue()
    queue.task("sync", concurrency=sqlqueue.Concurrency(limit=1, key=lambda p: p["tenant"]))(
        lambda tenant, n: None
    )
    queue.task("free")(lambda n: None)
    return queue


def _claim(queue: sqlqueue.Queue, worker: str) -> list[Any]:
    return queue.store.claim(
        queues=["default"],
        job_types=None,
        limit=50,
        worker_id=worker,
        lease_seconds=30,
        limits=LIMITS,
    )


@contextmanager
def _statements(engine: sa.Engine) -> Iterator[list[tuple[Any, str]]]:
    """The statements run on ``engine`` in the block: each as executed (the construct, or the
    driver's SQL) and as the driver got it."""
    seen: list[tuple[Any, str]] = []
    constructs: list[Any] = []

    def before_execute(conn: Any, element: Any, *args: Any) -> None:
        constructs.append(element)

    def before_cursor(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append((constructs[-1] if constructs else None, statement))

    sa.event.listen(engine, "before_execute", before_execute)
    sa.event.listen(engine, "before_cursor_execute", before_cursor)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_execute", before_execute)
        sa.event.remove(engine, "before_cursor_execute", before_cursor)


def _touching(seen: list[tuple[Any, str]], table: str) -> list[str]:
    return [sql for _, sql in seen if table in sql]


def test_a_claim_with_every_key_full_and_nothing_else_due_runs_only_the_walk(backend):
    queue = _queue(backend)
    with backend.engine.begin() as conn:
        for n in range(2):
            for tenant in ("a", "b", "c"):
                queue.enqueue(conn, "sync", {"tenant": tenant, "n": n})
    assert len(_claim(queue, "w1")) == 3  # one a key: every key is full now
    with _statements(backend.engine) as seen:
        assert _claim(queue, "w2") == []
    # One statement reads the tables: the walk, which also found no unlimited job due, so the
    # plain claim was not run.
    assert len(_touching(seen, "sqlqueue_")) == 1, seen
    assert "sqlqueue_key_walk" in _touching(seen, "sqlqueue_")[0]
    # A job without a limit is due: the walk says so, and the plain claim takes it.
    with backend.engine.begin() as conn:
        queue.enqueue(conn, "free", {"n": 0})
    assert [job.job_type for job in _claim(queue, "w3")] == ["free"]


def test_the_walk_is_built_once_and_reused(backend):
    queue = _queue(backend)
    with backend.engine.begin() as conn:
        for n in range(3):
            queue.enqueue(conn, "sync", {"tenant": "a", "n": n})
    walks = []
    for worker in ("w1", "w2", "w3"):
        with _statements(backend.engine) as seen:
            _claim(queue, worker)
        walks += [element for element, sql in seen if "sqlqueue_key_walk" in sql]
    assert len(walks) == 3
    assert walks[0] is walks[1] is walks[2]  # the same statement, not one built per claim


def test_the_keys_a_claim_found_are_locked_in_one_statement_and_counted_in_one(backend):
    queue = _queue(backend)
    tenants = [f"t{n}" for n in range(6)]
    with backend.engine.begin() as conn:
        for n in range(2):
            for tenant in tenants:
                queue.enqueue(conn, "sync", {"tenant": tenant, "n": n})
    with _statements(backend.engine) as seen:
        first = _claim(queue, "w1")
    assert len(first) == 6
    # Keys never seen before: one lock (finding none of their rows), one insert of all six,
    # one lock of all six; then one count.
    assert len(_touching(seen, "sqlqueue_limit_keys")) == 3, seen
    assert len([sql for sql in _touching(seen, "count(") if "sqlqueue_key_walk" not in sql]) == 1
    queue.store.cycle(
        worker_id="w1",
        succeeded=[(job.id, job.attempt) for job in first],
        failures=(),
        results=None,
        claims=(),
        job_types=None,
        lease_seconds=30,
    )
    with _statements(backend.engine) as seen:
        second = _claim(queue, "w2")
    assert len(second) == 6
    # Their rows exist now: one statement locks them all.
    assert len(_touching(seen, "sqlqueue_limit_keys")) == 1, seen
