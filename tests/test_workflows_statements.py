"""What a round of successes costs batches and workflows on the database: where the backend has
writing CTEs the batches' counters and the release of the steps after those that ended travel
in the completion's own statement, with the same counts and releases as the separate
statements give elsewhere, and a step added while the round waited for its workflow's row is
released all the same; the release of a wide fan-out finds each released job by its key,
never walking the waiting jobs."""

from __future__ import annotations

import threading
from typing import Any

import sqlalchemy as sa

import sqlqueue
from sqlqueue import JobRequest, Workflow
from sqlqueue._schema import batches, jobs, workflow_steps
from sqlqueue._store import settled_completion, workflows
from sqlqueue._store.claim_floor import Released
from sqlqueue._store.workflow_release import _release_statements
from tests._support import wait_until
from tests._support.locks import innodb_transactions
from tests._support.statements import statements
from tests.conftest import Backend


def _queue(backend: Backend) -> sqlqueue.Queue:
    queue = backend.queue()
    queue.task("step", max_attempts=1)(lambda: None)
    return queue


def _chains(queue: sqlqueue.Queue, count: int) -> list[sqlqueue.WorkflowHandle]:
    with queue.engine.begin() as conn:
        handles = []
        for _ in range(count):
            wf = Workflow()
            wf.add("first", JobRequest(job_type="step"))
            wf.add("second", JobRequest(job_type="step"), after=["first"])
            handles.append(queue.enqueue_workflow(conn, wf))
        return handles


def _counters(queue: sqlqueue.Queue, ids: list[int]) -> list[tuple[Any, ...]]:
    with queue.engine.connect() as conn:
        query = (
            sa.select(batches.c.succeeded, batches.c.finished_at.is_not(None))
            .where(batches.c.id.in_(ids))
            .order_by(batches.c.id)
        )
        return [tuple(row) for row in conn.execute(query)]


def _writes(sql: list[str]) -> list[str]:
    """The statements of a round but its session settings (PostgreSQL's relaxed commit)."""
    return [one for one in sql if not one.lstrip().upper().startswith("SET ")]


def test_a_round_of_successes_counts_and_releases_in_the_completions_statement(backend):
    """The first steps of 3 chains and a child of a batch succeed in one round, told the
    batches their jobs were claimed with: each workflow counts one success and releases its
    second step, the batch counts one; where writing CTEs exist the round is one statement
    (before: the completion, an UPDATE of the batches, the release)."""
    queue = _queue(backend)
    handles = _chains(queue, 3)
    with queue.engine.begin() as conn:
        batch = queue.enqueue_batch(conn, [JobRequest(job_type="step")] * 2)
    claimed = queue.store.claim(
        queues=["default"], job_types=None, limit=100, worker_id="w1", lease_seconds=60
    )
    ending = [job for job in claimed if job.id != batch.job_ids[1]]
    with statements(queue.engine) as sent:
        landed = queue.store.finish(
            worker_id="w1",
            succeeded=[job.fence for job in ending],
            failures=[],
            batch_ids=[job.batch_id for job in ending if job.batch_id is not None],
        )
    assert landed == {job.id for job in ending}
    with queue.engine.connect() as conn:
        seconds = [handle.job_ids["second"] for handle in handles]
        statuses = conn.execute(sa.select(jobs.c.status).where(jobs.c.id.in_(seconds))).scalars()
        assert set(statuses) == {"queued"}
    assert _counters(queue, [h.id for h in handles] + [batch.id]) == [(1, False)] * 4
    if backend.capable("modifying_ctes"):
        assert not [sql for sql in sent.sql if sql.lstrip().startswith("UPDATE sqlqueue_batches")]
        assert len(_writes(sent.sql)) == 1, sent.sql


def test_a_round_ending_chains_last_steps_finishes_them_in_the_completions_statement(backend):
    """The second steps' round finishes their workflows (where writing CTEs exist, in the
    completion's one statement; elsewhere with no statement for their steps); a lease lost
    meanwhile counts nowhere."""
    queue = _queue(backend)
    handles = _chains(queue, 3)
    firsts = queue.store.claim(
        queues=["default"], job_types=None, limit=100, worker_id="w1", lease_seconds=60
    )
    queue.store.finish(
        worker_id="w1",
        succeeded=[job.fence for job in firsts],
        failures=[],
        batch_ids=[h.id for h in handles],
    )
    seconds = queue.store.claim(
        queues=["default"], job_types=None, limit=100, worker_id="w1", lease_seconds=60
    )
    lost = seconds[0]
    with queue.engine.begin() as conn:  # the reaper took it back meanwhile
        conn.execute(sa.update(jobs).where(jobs.c.id == lost.id).values(status="queued"))
    with statements(queue.engine) as sent:
        landed = queue.store.finish(
            worker_id="w1",
            succeeded=[job.fence for job in seconds],
            failures=[],
            batch_ids=[h.id for h in handles],
        )
    assert landed == {job.id for job in seconds[1:]}
    ids = sorted(h.id for h in handles)
    expected = [(1, False) if id_ == lost.batch_id else (2, True) for id_ in ids]
    assert _counters(queue, ids) == expected
    if backend.capable("modifying_ctes"):
        assert len(_writes(sent.sql)) == 1, sent.sql
    else:  # no statement for the steps of workflows that finished
        assert sent.touching("sqlqueue_workflow_steps") == []


def test_a_burst_worker_sends_no_batch_update_of_its_own_for_chains(backend):
    """A real worker draining chains: every round's batches' counters travel in its completion
    where writing CTEs exist (before, each round sent a separate ``UPDATE sqlqueue_batches``),
    and every step succeeds once."""
    queue = _queue(backend)
    handles = _chains(queue, 20)
    with statements(queue.engine) as sent:
        queue.worker(concurrency=4, poll_interval=0.05, listen=False).run(burst=True)
    for handle in handles:
        status = queue.get_workflow(handle.id)
        assert status is not None
        assert status.succeeded
    assert queue.stats().by_status["succeeded"] == 40
    separate = [sql for sql in sent.sql if sql.lstrip().startswith("UPDATE sqlqueue_batches")]
    if backend.capable("modifying_ctes"):
        assert separate == []


def test_a_wide_fan_outs_release_finds_each_job_by_its_key(backend):
    """Releasing the 800 steps after a root looks each released job up by its primary key:
    the plan of the release names no index on the status, which the planner used to walk
    every waiting job for each step (a 3,000-step fan-out: 1,500 entries per step, O(n²))."""
    backend.requires("modifying_ctes")
    queue = _queue(backend)
    wf = Workflow()
    wf.add("root", JobRequest(job_type="step"))
    for n in range(800):
        wf.add(f"s{n}", JobRequest(job_type="step"), after=["root"])
    with queue.engine.begin() as conn:
        handle = queue.enqueue_workflow(conn, wf)
    _, release = _release_statements(queue.dialect, None)
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, sql: str, parameters: Any, *_: Any) -> None:
        sent.append((sql, parameters))

    with queue.engine.connect() as conn:
        sa.event.listen(conn, "before_cursor_execute", record)
        with conn.begin() as transaction:  # the release's SQL as sent, then undone
            released = conn.execute(release, {"ended": [handle.job_ids["root"]]}).all()
            transaction.rollback()
        sa.event.remove(conn, "before_cursor_execute", record)
        assert len(released) == 800
        with conn.begin():
            sql, parameters = sent[-1]
            rows = conn.exec_driver_sql(f"EXPLAIN {sql}", parameters)
            plan = "\n".join(str(row[0]) for row in rows)
    assert "ix_sqlqueue_jobs_status" not in plan, plan
    assert "pk_sqlqueue_jobs" in plan, plan


def _a_session_waits_for_a_lock(engine: sa.Engine) -> bool:
    """Whether some session of this database waits for a row lock now (the server's view)."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            query = (
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
        else:  # InnoDB's status report is live; innodb_trx may be a stale copy
            entries = innodb_transactions(engine, database_only=True).values()
            return any("LOCK WAIT" in entry for entry in entries)
        return bool(conn.exec_driver_sql(query).scalar())


def test_a_step_added_while_its_upstreams_round_waits_for_the_workflow_is_released(backend):
    """A running step adds ``late`` after ``a`` (holding the workflow's row, ``a`` still
    running for it: ``late`` waits for one upstream) while a worker's round completes ``a``
    and waits for that row. Once the adding transaction commits, the round must release
    ``late`` too. Its one statement sees only the edges committed before it started, so it
    notices that the workflow's total grew during the wait and leaves that workflow to a
    release of its own after the wait (without that, ``late`` waited for ever). The danger
    is where a round's statements are folded into writing CTEs."""
    backend.requires("modifying_ctes")
    queue = _queue(backend)
    wf = Workflow()
    wf.add("a", JobRequest(job_type="step"))
    wf.add("b", JobRequest(job_type="step"), after=["a"])
    with queue.engine.begin() as conn:
        handle = queue.enqueue_workflow(conn, wf)
    [claimed] = queue.store.claim(
        queues=["default"], job_types=None, limit=5, worker_id="w", lease_seconds=60
    )
    row = queue._workflow_row("late", JobRequest(job_type="step"))
    landed: list[set[int]] = []
    errors: list[BaseException] = []

    def finish() -> None:
        try:
            landed.append(
                queue.store.finish(
                    worker_id="w", succeeded=[claimed.fence], failures=[], batch_ids=[handle.id]
                )
            )
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=finish, daemon=True)
    with queue.engine.connect() as conn, conn.begin():
        workflows.add_step(conn, queue.dialect, handle.id, name="late", row=row, after=["a"])
        thread.start()
        wait_until(
            lambda: bool(errors or landed) or _a_session_waits_for_a_lock(queue.engine),
            timeout=20,
            what="the round to wait for the workflow's row",
        )
        assert not landed  # it waits for the adding transaction
    thread.join(30)
    assert not thread.is_alive()
    assert errors == []
    assert landed == [{claimed.id}]
    status = queue.get_workflow(handle.id)
    assert status is not None
    assert {name: str(step.status) for name, step in status.steps.items()} == {
        "a": "succeeded",
        "b": "queued",
        "late": "queued",
    }
    with queue.engine.connect() as conn:  # a's ending counted once in each step after it
        waiting_on = dict(
            conn.execute(
                sa.select(workflow_steps.c.name, workflow_steps.c.waiting_on).where(
                    workflow_steps.c.workflow_id == handle.id
                )
            ).all()
        )
    assert waiting_on == {"a": 0, "b": 0, "late": 0}


def test_a_round_in_a_big_workflow_reads_only_the_steps_that_ended(backend):
    """A round ending 10 of the 800 steps after a root finds those steps by their jobs' ids:
    the plan of its one statement reads no step by the workflow's id, which would read every
    step of the workflow in each round (a 3,000-step fan-out: 3,000 rows a round, O(n²))."""
    backend.requires("modifying_ctes")
    queue = _queue(backend)
    wf = Workflow()
    wf.add("root", JobRequest(job_type="step"))
    for n in range(800):
        wf.add(f"s{n}", JobRequest(job_type="step"), after=["root"])
    with queue.engine.begin() as conn:
        handle = queue.enqueue_workflow(conn, wf)
    [root] = queue.store.claim(
        queues=["default"], job_types=None, limit=1, worker_id="w", lease_seconds=60
    )
    queue.store.finish(worker_id="w", succeeded=[root.fence], failures=[], batch_ids=[handle.id])
    claimed = queue.store.claim(
        queues=["default"], job_types=None, limit=10, worker_id="w", lease_seconds=60
    )
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, sql: str, parameters: Any, *_: Any) -> None:
        sent.append((sql, parameters))

    with queue.engine.connect() as conn:
        sa.event.listen(conn, "before_cursor_execute", record)
        with conn.begin() as transaction:  # the round's statement as sent, then undone
            done = settled_completion.complete_and_settle(
                conn,
                queue.dialect,
                worker_id="w",
                fences=[job.fence for job in claimed],
                batch_ids=[handle.id],
            )
            transaction.rollback()
        sa.event.remove(conn, "before_cursor_execute", record)
        assert set(done.landed) == {job.id for job in claimed}
        with conn.begin():
            sql, parameters = sent[-1]
            rows = conn.exec_driver_sql(f"EXPLAIN {sql}", parameters)
            plan = "\n".join(str(row[0]) for row in rows)
    assert "(workflow_id = sqlqueue_held" not in plan, plan


def test_a_success_whose_batch_the_round_was_not_told_of_is_settled_all_the_same(backend):
    """``batch_ids`` is what the worker claimed the jobs with; should a caller name the wrong
    batch, the step's success still counts in its workflow and releases the step after it
    (before, the job was marked succeeded and its workflow waited for ever)."""
    backend.requires("modifying_ctes")
    queue = _queue(backend)
    [chain, other] = _chains(queue, 2)
    [first] = queue.store.claim(
        queues=["default"], job_types=None, limit=1, worker_id="w", lease_seconds=60
    )
    assert first.batch_id == chain.id
    landed = queue.store.finish(
        worker_id="w", succeeded=[first.fence], failures=[], batch_ids=[other.id]
    )
    assert landed == {first.id}
    assert _counters(queue, [chain.id, other.id]) == [(1, False), (0, False)]
    status = queue.get_workflow(chain.id)
    assert status is not None
    assert status.steps["second"].status == "queued"


def test_the_folded_completion_reads_the_same_rows_straight_from_the_driver(backend):
    """PostgreSQL sends the folded completion straight to the driver when nothing listens (its
    cache key is some 3,000 elements SQLAlchemy would hash at each execution): the same round
    read through SQLAlchemy (a listener on the connection) gives the same jobs, the same batch
    rows (a callback's document, the workflow that finished) and the same released steps, due
    in UTC as SQLAlchemy gives them."""
    backend.requires("modifying_ctes")
    queue = _queue(backend)
    handles = _chains(queue, 2)
    with queue.engine.begin() as conn:
        batch = queue.enqueue_batch(
            conn,
            [JobRequest(job_type="step")],
            on_complete=JobRequest(job_type="step", queue="callbacks"),
        )
    claimed = queue.store.claim(
        queues=["default"], job_types=None, limit=100, worker_id="w1", lease_seconds=60
    )
    assert len(claimed) == 3, "the two first steps and the batch's child"
    fences = [job.fence for job in claimed]
    batch_ids = [job.batch_id for job in claimed if job.batch_id is not None]

    def round_(listening: bool) -> settled_completion.Completed:
        with queue.engine.connect() as conn:
            if listening:  # SQLAlchemy's execution path, as a listener needs it
                sa.event.listen(conn, "before_cursor_execute", lambda *_: None)
            done = settled_completion.complete_and_settle(
                conn, queue.dialect, worker_id="w1", fences=fences, batch_ids=batch_ids
            )
            conn.rollback()
        return done

    direct, through_sqlalchemy = round_(False), round_(True)
    assert direct.landed == through_sqlalchemy.landed
    assert set(direct.landed) == {job.id for job in claimed}
    assert direct.held == through_sqlalchemy.held
    assert list(direct.held) == [batch.id], "only the batch with a callback to enqueue"
    assert direct.held[batch.id]["on_complete"] is not None

    # The same steps, each due when its round released it (the two rounds ran apart).
    def where(steps: list[Released]) -> list[tuple[int, str, str, int]]:
        return [(step.job_id, step.queue, step.job_type, step.priority) for step in steps]

    assert where(direct.released) == where(through_sqlalchemy.released)
    assert sorted(step.job_id for step in direct.released) == sorted(
        handle.job_ids["second"] for handle in handles
    )
    assert all(step.due.utcoffset() is not None for step in direct.released)
