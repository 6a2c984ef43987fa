"""Degrade, don't stop: two real worker processes whose database fails 5 % of their statements
at random (a real transient driver error, tests/apps/flaky_app.py) still run every job, and
every job's effect — written in ``ctx.transaction()`` with its success — lands exactly once.

A failed statement must not cost seconds: the workers' logged retry waits stay within the
quick cap (sqlqueue/_worker/retries.py). How fast they drain against a healthy database is a
figure of ``python -m bench --faults``, not of this test.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._worker.retries import QUICK_CAP_SECONDS
from tests.apps.flaky_effects import EFFECTS, create_effects
from tests.apps.processes import wait_until

# Many worker processes at once: under pytest-xdist these modules share one group, so
# two of them never run at the same time on a 2-core machine (see docs/development.md).
pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("many_processes")]

JOBS = 300
#: Generous: healthy, the two workers run these in about a second.
DEADLINE_SECONDS = 120
_WAIT = re.compile(r"retrying in ([0-9.]+) s")


def test_workers_whose_statements_fail_at_5_percent_run_every_job_exactly_once(
    backend, workers, monkeypatch
):
    create_effects(backend.engine)
    queue = backend.queue()
    queue.task("flaky.effect")(lambda: None)  # enqueued here, run by the workers' own task
    with backend.engine.begin() as conn:
        ids = queue.enqueue_many(conn, [sqlqueue.JobRequest(job_type="flaky.effect")] * JOBS)
    monkeypatch.setenv("FLAKY_FAILURE_RATE", "0.05")
    app = "tests.apps.flaky_app:queue"
    started = [
        workers.start("--concurrency", "4", "--poll-interval", "0.05", app=app) for _ in range(2)
    ]

    def done() -> bool:
        for worker in started:
            assert worker.popen.poll() is None, f"a worker died\n{worker.describe()}"
        with backend.engine.connect() as conn:
            finished = conn.execute(
                sa.text("SELECT count(*) FROM sqlqueue_jobs WHERE status = 'succeeded'")
            ).scalar_one()
        return int(finished) == JOBS

    wait_until(
        done,
        timeout=DEADLINE_SECONDS,
        what=f"{JOBS} jobs to succeed",
        interval=0.2,
        explain=lambda: "\n".join(worker.describe() for worker in started),
    )
    for worker in started:
        assert worker.stop() == 0, worker.describe()

    with backend.engine.connect() as conn:
        effects = Counter(conn.execute(sa.select(EFFECTS.c.job_id)).scalars())
        attempts = int(
            conn.execute(sa.text("SELECT sum(attempts) FROM sqlqueue_jobs")).scalar_one()
        )
    assert effects == dict.fromkeys(ids, 1)  # every job's effect, none twice
    logs = "\n".join(worker.log() for worker in started)
    waits = [float(found) for found in _WAIT.findall(logs)]
    print(
        f"\n    [flaky database {backend.name}] {JOBS} jobs, 2 workers x 4, 5 % of statements "
        f"failing: {len(waits)} retries (longest wait {max(waits, default=0):.3f} s), "
        f"{attempts - JOBS} attempts failed (their own transaction hit) and were retried"
    )
    assert waits, "the injected failures reached the worker's retries"
    assert max(waits) <= QUICK_CAP_SECONDS * 1.2  # the cap and its jitter: never seconds more
