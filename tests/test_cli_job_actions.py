"""``sqlqueue run-now``, ``sqlqueue reschedule`` and ``sqlqueue cancel --by --reason``: the
web page's actions on waiting jobs from the command line, each recorded with who and why
(``queue.job_actions``) on each backend's real database; a bad time is exit 2 that says why."""

from __future__ import annotations

import json
from datetime import UTC, timedelta

import sqlqueue
from tests._support import drain, enqueue, run_cli
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
    # "+2h" from the database clock the command read, written with updated_at a moment later
    # (the later commands do not touch this job): two hours after, less that moment.
    assert job.updated_at + timedelta(minutes=119) < job.next_run_at
    assert job.next_run_at <= job.updated_at + timedelta(hours=2)
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


def test_jobs_show_lists_the_actions_on_a_job_with_who_when_and_why(backend: Backend) -> None:
    queue = backend.queue()
    queue.task("report")(lambda n=0: None)
    job_id = queue.enqueue(backend.engine, "report", {"n": 1}, delay=3600)
    untouched = queue.enqueue(backend.engine, "report", {"n": 2}, delay=3600)
    for command in (
        ["reschedule", str(job_id), "--at", "+2h", "--by", "ada", "--reason", "after deploy"],
        ["run-now", str(job_id), "--by", "bob", "--reason", "customer waits"],
        ["cancel", str(job_id), "--by", "cy", "--reason", "withdrawn"],
    ):
        done = run_cli(*command, url=backend.url)
        assert done.returncode == 0, done.stderr
    shown = run_cli("jobs", "show", str(job_id), url=backend.url)
    as_json = run_cli("jobs", "show", str(job_id), "--json", url=backend.url)
    bare = run_cli("jobs", "show", str(untouched), url=backend.url)

    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    lines = [line.strip() for line in text[text.index("actions:\n") :].splitlines()[1:4]]
    said = [line.split(" ", 2)[2] for line in lines]
    assert said[0].startswith("reschedule by ada: after deploy (run at ")
    assert said[1:] == ["run-now by bob: customer waits", "cancel by cy: withdrawn"]
    recorded = [
        a.at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S") for a in queue.job_actions(job_id)
    ]
    assert [line[:19] for line in lines] == recorded  # when, to the second (UTC)
    assert as_json.returncode == 0, as_json.stderr
    actions = json.loads(as_json.stdout)["actions"]
    assert [(a["action"], a["by"], a["reason"]) for a in actions] == [
        ("reschedule", "ada", "after deploy"),
        ("run_now", "bob", "customer waits"),
        ("cancel", "cy", "withdrawn"),
    ]
    assert "run_at" in actions[0]["detail"]
    assert bare.returncode == 0, bare.stderr
    assert "actions:" not in bare.stdout


def test_jobs_show_lists_a_requeue_and_a_discard(backend: Backend) -> None:
    queue = backend.queue()

    @queue.task("boom", max_attempts=1)
    def boom(n: int) -> None:
        raise ValueError("no")

    first, second = enqueue(queue, "boom", 2)
    drain(queue)
    assert run_cli(
        "dead", "requeue", "--ids", str(first), "--by", "ada", "--reason", "fixed",
        url=backend.url,
    ).returncode == 0  # fmt: skip
    assert run_cli(
        "dead", "discard", "--ids", str(second), "--by", "bob", "--reason", "spam",
        url=backend.url,
    ).returncode == 0  # fmt: skip
    requeued = queue.get_job(first)
    assert requeued is not None
    shown_first = run_cli("jobs", "show", str(first), url=backend.url).stdout
    shown_second = run_cli("jobs", "show", str(second), url=backend.url).stdout
    assert f"requeue by ada: fixed (as job {requeued.requeued_as})" in shown_first
    assert "discard by bob: spam" in shown_second.split("actions:\n")[1]
