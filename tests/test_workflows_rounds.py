"""What one worker round costs workflows and batches, and how soon it runs what it released:
the endings of any number of batches and workflows settle in a constant number of statements
(no statement per batch or per workflow), a round mixing batches that finish, with and without
a callback, with batches and workflows that go on counts each one right, and a released step
starts at once, without waiting for a poll: in the round that released it, in another
queue's pool, or after a step that completed in its handler's transaction. Every backend."""

from __future__ import annotations

import threading
from typing import Any

import sqlalchemy as sa

import sqlqueue
from sqlqueue import JobRequest, Workflow
from sqlqueue._schema import batches, jobs
from sqlqueue._store.rows import Failure
from tests._support import wait_until
from tests._support.statements import is_claim, statements
from tests.conftest import Backend


def _queue(backend: Backend) -> sqlqueue.Queue:
    queue = backend.queue()
    queue.task("step", max_attempts=1)(lambda label: label)
    queue.task("done", max_attempts=1)(lambda: None)
    return queue


def _step(label: str) -> JobRequest:
    return JobRequest(job_type="step", payload={"label": label})


def _chains(queue: sqlqueue.Queue, count: int) -> list[sqlqueue.WorkflowHandle]:
    handles = []
    with queue.engine.begin() as conn:
        for _ in range(count):
            wf = Workflow()
            wf.add("first", _step("first"))
            wf.add("second", _step("second"), after=["first"])
            handles.append(queue.enqueue_workflow(conn, wf))
    return handles


def _claim_all(queue: sqlqueue.Queue, worker: str = "w1") -> list[Any]:
    return queue.store.claim(
        queues=["default"], job_types=None, limit=1000, worker_id=worker, lease_seconds=60
    )


def _status(queue: sqlqueue.Queue, job_id: int) -> str:
    with queue.engine.connect() as conn:
        return str(conn.execute(sa.select(jobs.c.status).where(jobs.c.id == job_id)).scalar_one())


def _statements_to_settle(queue: sqlqueue.Queue, chains: int) -> int:
    """Statements of one round that ends the first step of ``chains`` new two-step chains and
    one child of as many new batches."""
    handles = _chains(queue, chains)
    with queue.engine.begin() as conn:
        made = [queue.enqueue_batch(conn, [_step("child"), _step("child")]) for _ in range(chains)]
    wanted = {handle.job_ids["first"] for handle in handles} | {b.job_ids[0] for b in made}
    ending = [job.fence for job in _claim_all(queue) if job.id in wanted]
    assert len(ending) == 2 * chains
    with statements(queue.engine) as sent:
        landed = queue.store.finish(worker_id="w1", succeeded=ending, failures=[])
    assert landed == wanted
    for handle in handles:  # every second step was released by that round
        assert _status(queue, handle.job_ids["second"]) == "queued"
    ids = [handle.id for handle in handles] + [batch.id for batch in made]
    with queue.engine.connect() as conn:
        counts = conn.execute(
            sa.select(batches.c.succeeded, batches.c.finished_at.is_(None)).where(
                batches.c.id.in_(ids)
            )
        ).all()
    assert counts == [(1, True)] * (2 * chains)  # one each, none finished
    return len(sent.sql)


def test_a_round_settles_any_number_of_batches_and_workflows_in_the_same_statements(backend):
    """No statement per batch or per workflow: ending the first steps of 3 chains and a child
    of 3 batches sends as many statements as 30 of each (before, each batch cost its own
    UPDATE, and each that finished another)."""
    queue = _queue(backend)
    few = _statements_to_settle(queue, 3)
    many = _statements_to_settle(queue, 30)
    assert many == few


def _statements_to_end(queue: sqlqueue.Queue, wf: Workflow, step: str) -> tuple[int, int]:
    """Statements (counted by a ``before_cursor_execute`` listener) of the round that ends
    ``step`` of ``wf``, just enqueued, and how many steps that round released."""
    with queue.engine.begin() as conn:
        handle = queue.enqueue_workflow(conn, wf)
    [ending] = [job.fence for job in _claim_all(queue) if job.id == handle.job_ids[step]]
    sent: list[str] = []

    def record(*args: Any) -> None:
        sent.append(str(args[2]))

    sa.event.listen(queue.engine, "before_cursor_execute", record)
    try:
        assert queue.store.finish(worker_id="w1", succeeded=[ending], failures=[]) == {
            handle.job_ids[step]
        }
    finally:
        sa.event.remove(queue.engine, "before_cursor_execute", record)
    status = queue.get_workflow(handle.id)
    assert status is not None
    return len(sent), status.counts[sqlqueue.JobStatus.QUEUED]


def _fan_in(n: int) -> Workflow:
    wf = Workflow()
    parts = [wf.add(f"p{i}", _step(f"p{i}")) for i in range(n)]
    wf.add("join", _step("join"), after=parts)
    return wf


def _fan_out(n: int) -> Workflow:
    wf = Workflow()
    wf.add("root", _step("root"))
    for i in range(n):
        wf.add(f"c{i}", _step(f"c{i}"), after=["root"])
    return wf


def test_ending_a_step_costs_no_statement_per_sibling(backend):
    """Ending one upstream of a 300-way fan-in (299 siblings still running) and the root of a
    300-way fan-out (300 steps released) sends as many statements as for 3: the release
    counts and moves steps in set statements, never one per step after it or beside it."""
    queue = _queue(backend)
    few_in, released = _statements_to_end(queue, _fan_in(3), "p0")
    many_in, released_many = _statements_to_end(queue, _fan_in(300), "p0")
    assert (released, released_many) == (0, 0)  # claimed, not queued; the join still waits
    assert many_in == few_in
    few_out, released = _statements_to_end(queue, _fan_out(3), "root")
    many_out, released_many = _statements_to_end(queue, _fan_out(300), "root")
    assert (released, released_many) == (3, 300)
    assert many_out == few_out


def test_a_round_of_mixed_endings_counts_each_batch_and_finishes_only_the_complete_ones(backend):
    """One round ends: both children of a batch with a callback (it finishes and enqueues the
    callback once), one child of a batch without one (it finishes), two of three children of
    another (it goes on, with a count the others do not share), a dead child of a batch with
    ``on_dead`` (that callback), and the first step of a chain (the second is released)."""
    queue = _queue(backend)
    done = JobRequest(job_type="done")
    with queue.engine.begin() as conn:
        with_callback = queue.enqueue_batch(conn, [_step("a1"), _step("a2")], on_complete=done)
        alone = queue.enqueue_batch(conn, [_step("b1")])
        going_on = queue.enqueue_batch(conn, [_step("c1"), _step("c2"), _step("c3")])
        dying = queue.enqueue_batch(conn, [_step("d1")], on_complete=done, on_dead=done)
    [chain] = _chains(queue, 1)
    claimed = {job.payload["label"]: job for job in _claim_all(queue)}
    dead = claimed["d1"]
    failure = Failure(
        job_id=dead.id, attempt=dead.attempt, dead=True, retry_in=0.0, last_error="boom", errors=[]
    )
    succeeded = [claimed[label].fence for label in ("a1", "a2", "b1", "c1", "c2", "first")]
    landed = queue.store.finish(worker_id="w1", succeeded=succeeded, failures=[failure])
    assert len(landed) == 7
    with queue.engine.connect() as conn:
        rows = {
            row.id: row
            for row in conn.execute(
                sa.select(
                    batches.c.id,
                    batches.c.succeeded,
                    batches.c.dead,
                    batches.c.finished_at,
                    batches.c.callback_job_id,
                )
            )
        }
        callbacks = conn.execute(
            sa.select(jobs.c.id, jobs.c.batch_id).where(jobs.c.job_type == "done")
        ).all()
    assert (rows[with_callback.id].succeeded, rows[with_callback.id].dead) == (2, 0)
    assert rows[with_callback.id].finished_at is not None
    assert (rows[alone.id].succeeded, rows[alone.id].finished_at is None) == (1, False)
    assert rows[alone.id].callback_job_id is None
    assert (rows[going_on.id].succeeded, rows[going_on.id].finished_at) == (2, None)
    assert (rows[dying.id].dead, rows[dying.id].finished_at is None) == (1, False)
    assert sorted(batch_id for _, batch_id in callbacks) == sorted([with_callback.id, dying.id])
    by_batch = {batch_id: job_id for job_id, batch_id in callbacks}
    assert rows[with_callback.id].callback_job_id == by_batch[with_callback.id]
    assert rows[dying.id].callback_job_id == by_batch[dying.id]
    assert (rows[chain.id].succeeded, rows[chain.id].finished_at) == (1, None)
    assert _status(queue, chain.job_ids["second"]) == "queued"


def _run_until_succeeded(queue: sqlqueue.Queue, workflow_id: int, **options: Any) -> None:
    """Run a worker that polls every 60 s with wake-ups off until the workflow succeeded (at
    most 30 s): waiting for a poll anywhere would fail the test."""
    worker = queue.worker(poll_interval=60, listen=False, **options)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(
            lambda: (status := queue.get_workflow(workflow_id)) is not None and status.succeeded,
            timeout=30,
            what=f"workflow {workflow_id} to succeed without waiting for a poll",
        )
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()


def _chain(queue: sqlqueue.Queue, requests: list[JobRequest]) -> int:
    wf = Workflow()
    previous: list[str] = []
    for n, request in enumerate(requests):
        previous = [wf.add(f"s{n}", request, after=previous)]
    with queue.engine.begin() as conn:
        return queue.enqueue_workflow(conn, wf).id


def test_a_chains_next_step_starts_in_the_round_that_released_it_not_after_a_poll(backend):
    """Each step of a 4-step chain is released by the round that writes its upstream's
    outcome and claimed by the same round, so the chain ends in a few rounds."""
    queue = _queue(backend)
    _run_until_succeeded(queue, _chain(queue, [_step(f"s{n}") for n in range(4)]), concurrency=2)


def test_a_step_released_into_another_queue_is_claimed_by_that_queues_pool_at_once(backend):
    """The step after a ``default`` step is in ``other``, whose pool found nothing at first and
    rests until its poll: the round that releases the step claims for every pool."""
    queue = _queue(backend)
    later = JobRequest(job_type="step", payload={"label": "later"}, queue="other")
    workflow_id = _chain(queue, [_step("first"), later])
    _run_until_succeeded(queue, workflow_id, queues={"default": 1, "other": 1})


def test_a_step_released_by_its_upstreams_own_transaction_is_claimed_at_once(backend):
    """Steps that complete in their handler's transaction (``ctx.transaction()``) release the
    next step there, outside any claim round: the worker claims again at once."""
    queue = _queue(backend)

    @queue.task("in_transaction", max_attempts=1)
    def in_transaction(ctx: sqlqueue.JobContext) -> None:
        with ctx.transaction() as conn:
            conn.execute(sa.select(1))

    request = JobRequest(job_type="in_transaction")
    _run_until_succeeded(queue, _chain(queue, [request] * 3), concurrency=2)


def test_a_round_that_releases_nothing_sends_no_claim_for_a_resting_pool(backend):
    """Ending the children of a batch that releases nothing (no callback, no workflow) wakes
    no other pool: the ``other`` pool, resting after it found nothing, claims at the start and
    in the burst worker's last look only. Before, every round with an outcome of a batch made
    every pool claim (six children, six more claims of ``other``)."""
    queue = _queue(backend)
    with queue.engine.begin() as conn:
        queue.enqueue_batch(conn, [_step(f"c{n}") for n in range(6)])
    claims_of_other = []

    def record(conn: Any, cursor: Any, sql: str, parameters: Any, context: Any, many: bool) -> None:
        values = parameters.values() if isinstance(parameters, dict) else parameters or ()
        if is_claim(sql) and "other" in list(values):
            claims_of_other.append(sql)

    sa.event.listen(queue.engine, "before_cursor_execute", record)
    try:
        worker = queue.worker(queues={"default": 1, "other": 1}, poll_interval=60, listen=False)
        worker.run(burst=True)
    finally:
        sa.event.remove(queue.engine, "before_cursor_execute", record)
    assert queue.stats().by_status["succeeded"] == 6
    assert len(claims_of_other) <= 2


def test_a_round_ending_the_last_steps_of_chains_sends_nothing_for_their_steps(backend):
    """A workflow whose steps have all ended in the round has none waiting: the round ending
    the second steps of chains finishes the workflows and reads or writes no step row (it
    used to look up the steps after them, in vain, every such round)."""
    queue = _queue(backend)
    handles = _chains(queue, 3)
    firsts = [job.fence for job in _claim_all(queue)]
    queue.store.finish(worker_id="w1", succeeded=firsts, failures=[])
    seconds = [job.fence for job in _claim_all(queue)]
    assert {job_id for job_id, _ in seconds} == {h.job_ids["second"] for h in handles}
    with statements(queue.engine) as sent:
        queue.store.finish(worker_id="w1", succeeded=seconds, failures=[])
    assert sent.touching("sqlqueue_workflow_steps") == []
    for handle in handles:
        status = queue.get_workflow(handle.id)
        assert status is not None
        assert status.succeeded
        assert status.finished_at is not None


def test_a_step_added_by_a_running_step_into_a_resting_pools_queue_starts_at_once(backend):
    """``ctx.add_to_workflow`` with nothing to wait for queues the new step in its handler's
    transaction, outside any round and in no ``settle`` result: the ``other`` pool, resting
    after it found nothing, claims it at once, not after its 60 s poll."""
    queue = _queue(backend)

    @queue.task("grows", max_attempts=1)
    def grows(ctx: sqlqueue.JobContext) -> None:
        extra = JobRequest(job_type="step", payload={"label": "extra"}, queue="other")
        ctx.add_to_workflow("extra", extra)

    workflow_id = _chain(queue, [JobRequest(job_type="grows")])
    _run_until_succeeded(queue, workflow_id, queues={"default": 1, "other": 1})
    status = queue.get_workflow(workflow_id)
    assert status is not None
    assert set(status.steps) == {"s0", "extra"}


def test_children_added_by_a_running_child_into_a_resting_pools_queue_start_at_once(backend):
    """``ctx.add_to_batch`` queues the new children in the child's transaction: the ``other``
    pool, resting after it found nothing, claims them at once, not after its 60 s poll."""
    queue = _queue(backend)

    @queue.task("fans_out", max_attempts=1)
    def fans_out(ctx: sqlqueue.JobContext) -> None:
        ctx.add_to_batch(
            [JobRequest(job_type="step", payload={"label": "more"}, queue="other")] * 2
        )

    with queue.engine.begin() as conn:
        batch = queue.enqueue_batch(conn, [JobRequest(job_type="fans_out")])
    worker = queue.worker(poll_interval=60, listen=False, queues={"default": 1, "other": 1})
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(
            lambda: (status := queue.get_batch(batch.id)) is not None and status.finished,
            timeout=30,
            what="the batch to finish without waiting for a poll",
        )
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert queue.stats().by_status["succeeded"] == 3
