"""The smallest end-to-end check: enqueue, run a worker in burst mode, see the job succeed."""

from __future__ import annotations

import sqlqueue


def test_a_job_runs_to_success(backend):
    queue = backend.queue()
    seen = []

    @queue.task("greet")
    def greet(name: str) -> None:
        seen.append(name)

    with backend.engine.begin() as conn:
        job_id = greet.enqueue(conn, name="ada")

    queue.worker(concurrency=2, poll_interval=0.05).run(burst=True)

    assert seen == ["ada"]
    job = queue.get_job(job_id)
    assert job is not None
    assert job.status == sqlqueue.JobStatus.SUCCEEDED
    assert job.attempts == 1
