"""``sqlqueue run-now``, ``sqlqueue reschedule`` and ``sqlqueue cancel --by --reason``: the
web page's actions on waiting jobs from the command line, each recorded with who and why
(``queue.job_actions``) on each backend's real database; a bad time is exit 2 that says why."""

from __future__ import annotations

import json
from datetime import timedelta

import sqlqueue
from tests._support import enqueue, run_cli
from tests.conftest import Backend


def test_run_now_reschedule_and_cancel_record_who_and_why(backend: Backend) -> None:
    queue = backend.queue()
    queue.task("report")(lambda n=0: None)
    first, second, third = (
        queue.enqueue(backend.engine, "report", {"n": n}, delay=3600) for n in range(3)
    )
    enqueue(queue, "report", 1)  # due already: run-now leaves it alone

    made_due = run_cli(
        "run-now", str(first), "--by", "ada", "--reason", "customer waits", "--json",
        url=backend.url,
    )  # fmt: skip
    moved = run_cli(
        "reschedule", str(second), "--at", "+2h", "--by", "ada", "--reason", "after deploy",
        url=backend.url,
    )  # fmt: skip
    past = run_cli(
        "reschedule", str(second), "--at", "2001-01-01", "--by", "ada", "--reason", "x",
        url=backend.url,
    )  # fmt: skip
    cancelled = run_cli(
        "cancel", str(third), "--by", "ada", "--reason", "withdrawn", url=backend.url
    )

    assert made_due.returncode == 0, made_due.stderr
    assert json.loads(made_due.stdout) == {"made_due": 1}
    assert moved.returncode == 0, moved.stderr
    assert f"job {second}: runs at " in moved.stdout
    assert past.returncode == 2
    assert "--at: 2001-01-01 00:00:00 UTC is in the past" in past.stderr
    assert cancelled.returncode == 0, cancelled.stderr
    job = queue.get_job(second)
    assert job is not None
    assert job.next_run_at > queue.database_now() + timedelta(minutes=119)
    recorded = {
        job_id: [(a.action, a.by, a.reason) for a in queue.job_actions(job_id)]
        for job_id in (first, second, third)
    }
    assert recorded == {
        first: [("run_now", "ada", "customer waits")],
        second: [("reschedule", "ada", "after deploy")],
        third: [("cancel", "ada", "withdrawn")],
    }
    gone = queue.get_job(third)
    assert gone is not None
    assert gone.status is sqlqueue.JobStatus.CANCELLED
