"""The order in which a workflow's rows are locked: every transaction takes the workflow's row
before any of its steps' rows (a worker round, a step added by a running step, a requeue of a
dead step), so two of them never wait on each other crosswise. Two real connections on the
backends with row locks."""

from __future__ import annotations

import threading
from typing import Any

import sqlalchemy as sa

import sqlqueue
from sqlqueue import JobRequest, Workflow
from sqlqueue._schema import batches
from sqlqueue._store import counts, deadletter, workflows
from sqlqueue._store.rows import Failure
from tests._support import wait_until
from tests.conftest import Backend


def _waiting_for_a_lock(engine: sa.Engine, session: int) -> bool:
    """Whether database session ``session`` waits for a row lock now (the server's own view
    of its sessions: ``pg_stat_activity``, InnoDB's transactions)."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            query = "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :id"
        else:
            query = (
                "SELECT trx_state = 'LOCK WAIT' FROM information_schema.innodb_trx "
                "WHERE trx_mysql_thread_id = :id"
            )
        return bool(conn.execute(sa.text(query), {"id": session}).scalar())


def _session_id(conn: sa.Connection) -> int:
    query = (
        "SELECT pg_backend_pid()" if conn.dialect.name == "postgresql" else "SELECT CONNECTION_ID()"
    )
    return int(conn.exec_driver_sql(query).scalar_one())


def test_a_requeue_of_a_dead_step_and_a_step_added_after_it_never_deadlock(backend: Backend):
    """A running step adds a step after a dead one while an operator requeues the dead one.
    The adding transaction holds the workflow's row and then locks the dead step's row; the
    requeue used to lock the step's row first (moving it to the new job) and then wait for the
    workflow's row: a lock cycle, which the server broke by aborting one of them. Now the
    requeue takes the workflow's row first and waits there holding no step, and both commit."""
    backend.requires("row_locks")
    queue = backend.queue()
    queue.task("step", max_attempts=1)(lambda: None)
    dialect = queue.dialect
    wf = Workflow()
    wf.add("a", JobRequest(job_type="step"))
    wf.add("b", JobRequest(job_type="step"), after=["a"])
    with queue.engine.begin() as conn:
        handle = queue.enqueue_workflow(conn, wf)
    [claimed] = queue.store.claim(
        queues=["default"], job_types=None, limit=5, worker_id="w", lease_seconds=60
    )
    dead = Failure(
        job_id=claimed.id, attempt=claimed.attempt, dead=True, retry_in=0.0, last_error="x",
        errors=[],
    )  # fmt: skip
    assert queue.store.finish(worker_id="w", succeeded=[], failures=[dead]) == {claimed.id}
    added_row = queue._workflow_row("added", JobRequest(job_type="step"))
    with queue.engine.begin() as conn:  # a requeue takes the finished counts' mark first
        counts.create_mark(conn, dialect)
    errors: list[BaseException] = []
    session: list[int] = []
    requeued: list[int] = []

    def requeue() -> None:
        try:
            with queue.engine.connect() as conn, conn.begin():
                session.append(_session_id(conn))
                requeued.append(
                    deadletter.requeue_one(
                        conn, dialect, job_id=claimed.id, by="ops", reason="try again"
                    )
                )
        except BaseException as error:
            errors.append(error)

    adding: Any = None
    with queue.engine.connect() as conn, conn.begin():
        # The adding transaction takes the workflow's row first, as add_step does.
        conn.execute(
            sa.select(batches.c.id).where(batches.c.id == handle.id).with_for_update()
        ).one()
        thread = threading.Thread(target=requeue, daemon=True)
        thread.start()
        try:
            wait_until(
                lambda: (
                    bool(errors or requeued)
                    or (bool(session) and _waiting_for_a_lock(queue.engine, session[0]))
                ),
                timeout=20,
                what="the requeue to wait for the workflow's row",
            )
            adding = workflows.add_step(
                conn, dialect, handle.id, name="c", row=added_row, after=["a"]
            )
        except BaseException as error:
            errors.append(error)
            raise
        finally:
            if errors:
                conn.rollback()
    thread.join(30)
    assert not thread.is_alive()
    assert errors == []
    assert adding is not None
    assert len(requeued) == 1
    status = queue.get_workflow(handle.id)
    assert status is not None
    assert status.steps["a"].job_id == requeued[0]  # the new job took the dead one's place
    assert status.steps["c"].after == ("a",)
    assert {name: str(step.status) for name, step in status.steps.items()} == {
        "a": "queued", "b": "waiting", "c": "waiting"
    }  # fmt: skip
    assert isinstance(status, sqlqueue.WorkflowStatus)
