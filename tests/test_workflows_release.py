"""Releasing a workflow's steps: a diamond, a chain and a fan-in run each step after its
upstreams, exactly once, with their results in ``ctx.upstream_results``; two upstreams ending
in concurrent transactions release the join once; a step that completes in its own
transaction releases the steps after it in that transaction; a step whose completion failed
with the worker's round is written again by the worker's outbox, alone, and releases the steps
after it once. Every backend."""

from __future__ import annotations

import logging
import threading

import sqlalchemy as sa

import sqlqueue
from sqlqueue import JobRequest, JobStatus, Workflow
from sqlqueue._schema import workflow_steps
from sqlqueue._store import batches as store_batches
from sqlqueue._store import outcomes
from tests._support import drain
from tests._support.workflows import diamond as _diamond
from tests._support.workflows import enqueue_workflow as _enqueue
from tests._support.workflows import step_queue as _queue
from tests._support.workflows import step_request as _step
from tests._support.workflows import step_statuses as _statuses
from tests._support.workflows import workflow_status as _status
from tests.apps.statement_faults import FailStatements

#: The worker's completion of its round's successes, as every backend spells it (on PostgreSQL
#: inside the folded statement that also settles the workflows, settled_completion.py).
COMPLETE = r"UPDATE sqlqueue_jobs SET status=\S+, started_at=coalesce\(.*?\), finished_at="


def test_a_diamond_runs_in_order_and_each_step_reads_its_upstreams_results(backend):
    queue, seen = _queue(backend)
    handle = _enqueue(queue, _diamond())
    drain(queue)
    order = [label for label, _ in seen]
    assert order[0] == "a"
    assert order[-1] == "d"
    assert sorted(order[1:3]) == ["b", "c"]
    results = dict(seen)
    assert results["a"] == {}
    assert results["b"] == {"a": "result of a"}
    assert results["d"] == {"b": "result of b", "c": "result of c"}
    status = _status(queue, handle.id)
    assert (status.finished, status.succeeded, status.blocked_by) == (True, True, ())
    assert status.finished_at is not None
    assert all(step.result_available for step in status.steps.values())
    assert status.counts[JobStatus.SUCCEEDED] == 4


def test_a_chain_runs_one_step_after_another(backend):
    queue, seen = _queue(backend)
    wf = Workflow()
    previous: list[str] = []
    for n in range(6):
        previous = [wf.add(f"s{n}", _step(f"s{n}"), after=previous)]
    handle = _enqueue(queue, wf)
    drain(queue)
    assert [label for label, _ in seen] == [f"s{n}" for n in range(6)]
    assert _status(queue, handle.id).succeeded


def test_a_fan_in_releases_its_step_once_when_the_last_upstream_ends(backend):
    queue, seen = _queue(backend)
    wf = Workflow()
    parts = [wf.add(f"p{n}", _step(f"p{n}")) for n in range(40)]
    wf.add("join", _step("join"), after=parts)
    handle = _enqueue(queue, wf)
    drain(queue, concurrency=4)
    joined = [results for label, results in seen if label == "join"]
    assert len(joined) == 1
    assert joined[0] == {f"p{n}": f"result of p{n}" for n in range(40)}
    assert _status(queue, handle.id).succeeded


def test_two_upstreams_ending_in_concurrent_transactions_release_the_join_once(backend):
    """B and C of a diamond end in two open transactions: the second waits on the workflow's
    row (a row lock; SQLite's one writer) until the first commits, then sees D's count reach
    zero and alone releases it."""
    queue, _ = _queue(backend)
    wf = Workflow()
    wf.add("b", _step("b"))
    wf.add("c", _step("c"))
    wf.add("d", _step("d"), after=["b", "c"])
    handle = _enqueue(queue, wf)
    first, second = (
        queue.store.claim(
            queues=["default"], job_types=None, limit=1, worker_id=worker, lease_seconds=60
        )[0]
        for worker in ("w1", "w2")
    )
    assert {first.id, second.id} == {handle.job_ids["b"], handle.job_ids["c"]}
    dialect = queue.store.dialect
    with queue.store.engine.connect() as conn:
        dialect.begin_write(conn)
        endings = store_batches.Endings()
        outcomes.complete(conn, dialect, worker_id="w1", fences=[first.fence], endings=endings)
        store_batches.settle(conn, dialect, endings)
        finishing = threading.Thread(
            target=queue.store.finish,
            kwargs={"worker_id": "w2", "succeeded": [second.fence], "failures": []},
        )
        finishing.start()
        finishing.join(0.5)
        assert finishing.is_alive(), "the second ending did not wait for the first"
        conn.commit()
    finishing.join(30)
    assert not finishing.is_alive()
    assert _statuses(queue, handle.id)["d"] == "queued"
    with queue.engine.connect() as conn:
        row = conn.execute(
            sa.select(workflow_steps.c.waiting_on).where(workflow_steps.c.name == "d")
        ).scalar_one()
    assert row == 0  # decremented once by each upstream, never twice


def test_a_step_that_completes_in_its_own_transaction_releases_in_it(backend):
    queue = backend.queue()
    notes = sa.Table("wf_notes", sa.MetaData(), sa.Column("label", sa.String(20)))
    notes.create(queue.engine)

    @queue.task("write")
    def write(label: str, ctx: sqlqueue.JobContext) -> None:
        with ctx.transaction() as conn:
            conn.execute(notes.insert().values(label=label))

    wf = Workflow()
    wf.add("first", JobRequest(job_type="write", payload={"label": "first"}))
    wf.add("second", JobRequest(job_type="write", payload={"label": "second"}), after=["first"])
    handle = _enqueue(queue, wf)
    drain(queue)
    assert _status(queue, handle.id).succeeded
    with queue.engine.connect() as conn:
        assert sorted(conn.execute(sa.select(notes.c.label)).scalars()) == ["first", "second"]


def test_a_step_whose_completion_fails_with_its_round_is_written_alone_and_releases_once(
    backend, caplog
):
    """The first write of a's success fails (a real driver error, as the database gives now
    and then): the worker's round rolls back whole, its outbox writes a's outcome again in a
    transaction of its own (``Completer.write_alone``), and that write releases b and c — each
    step of the diamond runs exactly once, after its upstreams, with their results."""
    queue, seen = _queue(backend)
    handle = _enqueue(queue, _diamond())
    caplog.set_level(logging.ERROR, logger="sqlqueue.worker")
    with FailStatements(queue.engine, COMPLETE, times=1) as failing:
        drain(queue)
    assert failing.failed == 1
    assert failing.matched >= 2, "a's success was never written again"
    assert any("cannot" in record.getMessage() for record in caplog.records)
    order = [label for label, _ in seen]
    assert (order[0], sorted(order[1:3]), order[3:]) == ("a", ["b", "c"], ["d"])
    results = dict(seen)
    assert results["b"] == results["c"] == {"a": "result of a"}
    assert results["d"] == {"b": "result of b", "c": "result of c"}
    status = _status(queue, handle.id)
    assert (status.succeeded, status.finished_at is not None) == (True, True)
    jobs = [queue.get_job(job_id) for job_id in handle.job_ids.values()]
    assert [job.attempts for job in jobs if job is not None] == [1] * 4
