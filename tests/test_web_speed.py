"""The overview's most frequent errors on a big history (migration 0019): the same answer on
every backend — unhandled failures only, grouped by their first 200 characters — read from a
rollup of the dead jobs' errors folded with the finished counts, plus the few jobs that failed
or died since; requeue, discard and prune take what they handle off it, so the answer stays
exact whether a job was folded or not (``python -m bench.web`` times the overview)."""

from __future__ import annotations

from sqlalchemy import select

import sqlqueue
from sqlqueue._schema import error_counts
from tests._support import DEADLINE_SECONDS, drain, enqueue, wait_until
from tests._support.statements import statements
from tests.conftest import Backend


def _queue(backend: Backend) -> sqlqueue.Queue:
    queue = backend.queue()

    @queue.task("boom", max_attempts=1)
    def boom(n: int, error: str) -> None:
        raise ConnectionError(error)

    return queue


def _top(queue: sqlqueue.Queue) -> list[tuple[str, int]]:
    return [(error.error, error.count) for error in queue.stats().top_errors]


def _rollup(backend: Backend) -> dict[str, int]:
    with backend.engine.connect() as conn:
        return {str(e): int(n) for e, n in conn.execute(select(error_counts))}


def _fold_all(queue: sqlqueue.Queue, backend: Backend, expected: int) -> None:
    """Fold until the rollup holds ``expected`` jobs (with no margin, a job that died in the
    database clock's current instant waits for the next one)."""

    def folded() -> bool:
        queue.admin.fold_all_counts(margin=0)
        return sum(_rollup(backend).values()) == expected

    wait_until(
        folded,
        DEADLINE_SECONDS,
        what=f"{expected} dead jobs folded",
        explain=lambda: str(_rollup(backend)),
    )


def test_top_errors_count_unhandled_failures_by_their_first_200_characters(
    backend: Backend,
) -> None:
    queue = _queue(backend)
    long_a, long_b = "x" * 250 + "a", "x" * 250 + "b"  # the same first 200 characters
    enqueue(queue, "boom", 2, error=long_a)
    enqueue(queue, "boom", 1, error=long_b)
    enqueue(queue, "boom", 2, error="503 from crm")
    requeued, discarded = enqueue(queue, "boom", 2, error="410 Gone")
    drain(queue)
    queue.requeue(requeued, by="ada", reason="fixed")
    queue.discard(discarded, by="ada", reason="spam")
    drain(queue)  # the requeued copy dies again: unhandled, counted once

    live = _top(queue)
    _fold_all(queue, backend, 6)

    assert (
        live
        == _top(queue)
        == [
            ("ConnectionError: " + "x" * (200 - len("ConnectionError: ")), 3),
            ("ConnectionError: 503 from crm", 2),
            ("ConnectionError: 410 Gone", 1),
        ]
    )


def test_requeue_discard_and_prune_take_folded_and_live_jobs_off_the_top_errors(
    backend: Backend,
) -> None:
    queue = _queue(backend)
    crm = enqueue(queue, "boom", 4, error="503 from crm")
    gone = enqueue(queue, "boom", 3, error="410 Gone")
    drain(queue)
    _fold_all(queue, backend, 7)  # all seven in the rollup now
    late = enqueue(queue, "boom", 2, error="410 Gone")
    drain(queue)  # two more, counted live (after the mark)
    assert _top(queue) == [("ConnectionError: 410 Gone", 5), ("ConnectionError: 503 from crm", 4)]

    queue.requeue(crm[0], by="ada", reason="fixed")  # folded
    queue.discard(gone[0], by="ada", reason="spam")  # folded
    queue.discard(late[0], by="ada", reason="spam")  # live
    assert _top(queue) == [("ConnectionError: 410 Gone", 3), ("ConnectionError: 503 from crm", 3)]
    assert _rollup(backend) == {"ConnectionError: 410 Gone": 2, "ConnectionError: 503 from crm": 3}

    assert len(queue.requeue_where(error_contains="crm", by="ada", reason="fixed")) == 3
    assert _top(queue) == [("ConnectionError: 410 Gone", 3)]
    assert _rollup(backend) == {"ConnectionError: 410 Gone": 2}  # empty groups are dropped

    # Retention deletes the dead jobs, handled or not, folded or not: the counts follow.
    assert queue.prune(older_than=0, statuses=("dead",)) == 9
    assert _top(queue) == []
    assert _rollup(backend) == {}


def test_the_overview_reads_the_rollup_not_every_dead_job(backend: Backend) -> None:
    queue = _queue(backend)
    enqueue(queue, "boom", 3, error="503 from crm")
    drain(queue)
    _fold_all(queue, backend, 3)
    with backend.engine.begin() as conn:  # what only the rollup says: the jobs it counts
        conn.execute(error_counts.update().values(count=error_counts.c.count + 1000))
    with statements(backend.engine) as sent:
        assert _top(queue) == [("ConnectionError: 503 from crm", 1003)]
    (query,) = [sql for sql in sent.sql if "sqlqueue_error_counts" in sql]
    assert "sqlqueue_jobs.finished_at >=" in query  # the jobs dead since the mark, by time


def test_reset_counts_forgets_the_error_rollup_and_the_next_fold_counts_it_again(
    backend: Backend,
) -> None:
    queue = _queue(backend)
    enqueue(queue, "boom", 2, error="503 from crm")
    drain(queue)
    _fold_all(queue, backend, 2)

    queue.admin.reset_counts()

    assert _rollup(backend) == {}
    assert _top(queue) == [("ConnectionError: 503 from crm", 2)]  # live, every dead job
    _fold_all(queue, backend, 2)
    assert _top(queue) == [("ConnectionError: 503 from crm", 2)]
