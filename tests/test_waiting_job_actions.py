"""The operator's actions on waiting jobs when there is nothing to act on, on each backend's
real database: rescheduling a job that is not there says so by type and records nothing, and a
filtered cancel that matches no waiting job cancels nothing, records nothing and leaves the
finished jobs it matched as they were."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import job_actions
from tests._support import drain, enqueue
from tests.conftest import Backend


def recorded_actions(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(job_actions)).scalar_one())


def test_rescheduling_a_job_that_is_not_there_is_job_not_found(backend: Backend) -> None:
    queue = backend.queue()
    queue.task("report")(lambda n=0: None)
    (job_id,) = enqueue(queue, "report")
    missing = job_id + 1000
    later = datetime.now(UTC) + timedelta(hours=2)

    with pytest.raises(sqlqueue.JobNotFound, match=f"there is no job {missing}"):
        queue.reschedule(missing, later, by="ada", reason="after the deploy")

    assert recorded_actions(backend.engine) == 0
    job = queue.get_job(job_id)
    assert job is not None
    assert job.next_run_at < later  # the job that is there was not moved instead


def test_a_filtered_cancel_that_matches_no_waiting_job_cancels_and_records_nothing(
    backend: Backend,
) -> None:
    queue = backend.queue()
    queue.task("report")(lambda n=0: None)
    done = enqueue(queue, "report", 2)
    drain(queue)

    cancelled = queue.cancel_where(job_type="report", by="ada", reason="withdrawn")
    assert cancelled == 0
    assert queue.cancel_where(job_type="no.such.type", by="ada", reason="withdrawn") == 0

    jobs = [queue.get_job(job_id) for job_id in done]
    assert [job.status if job else None for job in jobs] == ["succeeded", "succeeded"]
    assert recorded_actions(backend.engine) == 0
