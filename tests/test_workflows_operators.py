"""What an operator does to a workflow's steps: cancel a step (one by one, or by a filter,
a job type or a queue, in any batch size, with each ``on_dead`` policy applied), discard
a dead one, prune with retention (a call or the worker's duty, which keep an unfinished
workflow's steps and forget a finished one whole), and read it with ``workflow show`` and
``jobs show``/``jobs list`` in the CLI. Every backend."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue import JobRequest, JobStatus, Workflow
from sqlqueue._schema import batches, jobs, workflow_edges, workflow_steps
from sqlqueue._store.filters import JobFilter
from tests._support import WorkerThread, count_jobs, drain, wait_until
from tests._support import run_cli as cli
from tests._support.workflows import diamond as _diamond
from tests._support.workflows import enqueue_workflow as _enqueue
from tests._support.workflows import step_queue as _queue
from tests._support.workflows import step_request as _step
from tests._support.workflows import step_statuses as _statuses
from tests._support.workflows import workflow_status as _status


def test_cancelling_a_waiting_step_blocks_under_wait_and_its_workflow_can_end(backend):
    queue, _ = _queue(backend)
    handle = _enqueue(queue, _diamond())
    cancelled = queue.cancel(handle.job_ids["b"], by="ops", reason="not needed")
    assert cancelled.status is JobStatus.CANCELLED
    drain(queue)
    assert _statuses(queue, handle.id) == {
        "a": "succeeded", "b": "cancelled", "c": "succeeded", "d": "waiting"
    }  # fmt: skip
    assert _status(queue, handle.id).blocked_by == ("b",)
    queue.cancel(handle.job_ids["d"])
    status = _status(queue, handle.id)
    assert status.finished
    assert status.finished_at is not None


def test_cancel_by_filter_applies_the_cancel_policy(backend):
    queue, _ = _queue(backend)
    handle = _enqueue(queue, _diamond(on_dead="cancel"))
    assert queue.cancel_where(job_ids=[handle.job_ids["a"]]) == 1
    assert _statuses(queue, handle.id) == dict.fromkeys("abcd", "cancelled")
    assert _status(queue, handle.id).finished_at is not None


def _cancel_one(queue: sqlqueue.Queue, job_id: int) -> None:
    queue.cancel(job_id, by="ops", reason="not needed")


def _cancel_by_ids(queue: sqlqueue.Queue, job_id: int) -> None:
    assert queue.cancel_where(job_ids=[job_id], by="ops", reason="not needed") == 1


def _cancel_by_queue(queue: sqlqueue.Queue, job_id: int) -> None:
    job = queue.get_job(job_id)
    assert job is not None
    assert queue.cancel_where(queue=job.queue, by="ops", reason="not needed") == 1


@pytest.mark.parametrize("on_dead", ["wait", "cancel", "run"])
@pytest.mark.parametrize("cancel", [_cancel_one, _cancel_by_ids, _cancel_by_queue],
                         ids=["one", "job_ids", "queue"])  # fmt: skip
def test_a_step_cancelled_while_queued_applies_the_policy_to_the_steps_after_it(
    backend, cancel, on_dead
):
    """A chain a → b → c whose first step an operator cancels before it ran, by its id or by
    a filter: under ``wait`` b and c wait, held by a; under ``cancel`` they are cancelled
    with the reason; under ``run`` they run. None of them runs a twice."""
    queue, seen = _queue(backend)
    wf = Workflow(on_dead=on_dead)
    wf.add("a", JobRequest(job_type="step", payload={"label": "a"}, queue="inbound"))
    wf.add("b", _step("b"), after=["a"])
    wf.add("c", _step("c"), after=["b"])
    handle = _enqueue(queue, wf)
    cancel(queue, handle.job_ids["a"])
    drain(queue, queues=["default", "inbound"])
    fate = {"wait": "waiting", "cancel": "cancelled", "run": "succeeded"}[on_dead]
    assert _statuses(queue, handle.id) == {"a": "cancelled", "b": fate, "c": fate}
    status = _status(queue, handle.id)
    assert status.blocked_by == (("a",) if on_dead == "wait" else ())
    assert status.finished is (on_dead != "wait")
    assert (status.finished_at is not None) is status.finished
    assert [label for label, _ in seen] == (["b", "c"] if on_dead == "run" else [])
    if on_dead == "cancel":
        for name in ("b", "c"):
            reason = queue.get_job(handle.job_ids[name]).last_error  # type: ignore[union-attr]
            assert reason is not None
            assert "'a'" in reason
            assert "on_dead='cancel'" in reason


@pytest.mark.parametrize("by", ["job_type", "queue"])
def test_cancel_by_type_or_queue_applies_the_cancel_policy(backend, by):
    queue, seen = _queue(backend)
    queue.task("fetch", max_attempts=1)(lambda: None)
    wf = Workflow(on_dead="cancel")
    wf.add("fetch", JobRequest(job_type="fetch", queue="inbound"))
    wf.add("other", _step("other"))
    wf.add("parse", _step("parse"), after=["fetch"])
    wf.add("store", _step("store"), after=["parse", "other"])
    handle = _enqueue(queue, wf)
    filters: dict[str, Any] = {"job_type": "fetch"} if by == "job_type" else {"queue": "inbound"}
    assert queue.cancel_where(**filters, by="ops", reason="feed retired") == 1
    assert _statuses(queue, handle.id) == {
        "fetch": "cancelled", "other": "queued", "parse": "cancelled", "store": "cancelled"
    }  # fmt: skip
    reason = queue.get_job(handle.job_ids["store"]).last_error  # type: ignore[union-attr]
    assert reason is not None
    assert "'fetch'" in reason
    drain(queue)
    assert [label for label, _ in seen] == ["other"]
    assert _status(queue, handle.id).finished_at is not None


@pytest.mark.parametrize("batch_size", [1, 2, 3, 100])
def test_cancel_by_filter_takes_waiting_steps_and_queued_jobs_in_any_batch_size(
    backend, batch_size
):
    """Waiting steps and queued jobs interleaved by id: every batch takes the oldest of both,
    and the cancel goes on until the filter matches nothing (each job once)."""
    queue, _ = _queue(backend)
    plain: list[int] = []
    steps: list[int] = []
    ups: list[int] = []
    for _ in range(3):
        plain.append(queue.enqueue(queue.engine, "step", {"label": "p"}, queue="q"))
        wf = Workflow()
        wf.add("up", JobRequest(job_type="step", payload={"label": "up"}, queue="other"))
        wf.add("s1", JobRequest(job_type="step", payload={"label": "s"}, queue="q"), after=["up"])
        wf.add("s2", JobRequest(job_type="step", payload={"label": "s"}, queue="q"), after=["up"])
        handle = _enqueue(queue, wf)
        steps += [handle.job_ids["s1"], handle.job_ids["s2"]]
        ups.append(handle.job_ids["up"])
    plain.append(queue.enqueue(queue.engine, "step", {"label": "p"}, queue="q"))
    first = queue.admin.cancel_batch(JobFilter(queue="q"), limit=batch_size, record=None)
    assert first.cancelled == sorted(plain + steps)[:batch_size]
    matching = len(plain) + len(steps)
    assert first.exhausted is (batch_size > matching)
    assert queue.cancel_where(queue="q", batch_size=batch_size) == matching - len(first.cancelled)
    with queue.engine.connect() as conn:
        rows = dict(conn.execute(sa.select(jobs.c.id, jobs.c.status)).all())
    assert {rows[job_id] for job_id in plain + steps} == {"cancelled"}
    assert {rows[job_id] for job_id in ups} == {"queued"}
    assert queue.cancel_where(queue="q", batch_size=batch_size) == 0


def test_discarding_a_dead_step_keeps_the_steps_after_it_waiting(backend):
    queue, _ = _queue(backend)
    wf = Workflow()
    wf.add("a", _step("a", fail=True))
    wf.add("b", _step("b"), after=["a"])
    handle = _enqueue(queue, wf)
    drain(queue)
    queue.discard(handle.job_ids["a"], by="ops", reason="handled by hand")
    assert _statuses(queue, handle.id) == {"a": "dead", "b": "waiting"}
    assert not _status(queue, handle.id).finished
    queue.cancel(handle.job_ids["b"], by="ops", reason="handled by hand")
    assert _status(queue, handle.id).finished_at is not None


def test_retention_keeps_the_steps_of_an_unfinished_workflow_then_forgets_it_whole(backend):
    queue, _ = _queue(backend)
    wf = Workflow()
    wf.add("a", _step("a"))
    wf.add("b", _step("b", fail=True), after=["a"])
    wf.add("c", _step("c"), after=["b"])
    handle = _enqueue(queue, wf)
    drain(queue)
    assert queue.prune(older_than=0, statuses=["succeeded", "dead"]) == 0
    assert _statuses(queue, handle.id) == {"a": "succeeded", "b": "dead", "c": "waiting"}
    queue.cancel(handle.job_ids["c"])
    assert _status(queue, handle.id).finished
    wait_until(
        lambda: (
            queue.prune(older_than=0, statuses=["succeeded", "dead", "cancelled"]) == 0
            and count_jobs(queue.engine) == 0
        ),
        what="the finished workflow's steps pruned",
    )
    assert queue.get_workflow(handle.id) is None
    with queue.engine.connect() as conn:
        for table in (batches, workflow_steps, workflow_edges):
            assert conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one() == 0


def test_the_retention_duty_keeps_an_unfinished_workflows_steps(backend):
    """A worker's Retention (batched prunes; on PostgreSQL the move into the history too)
    passes over the ended steps of an unfinished workflow while it prunes a plain job beside
    them; once the workflow finishes, its steps go too."""
    retention = sqlqueue.Retention(succeeded=0, dead=0, cancelled=0, interval=0.05, history_after=0)
    queue, _ = _queue(backend, retention=retention)
    wf = Workflow()
    wf.add("a", _step("a"))
    wf.add("b", _step("b", fail=True), after=["a"])
    wf.add("c", _step("c"), after=["b"])
    handle = _enqueue(queue, wf)
    ended = {"a": "succeeded", "b": "dead", "c": "waiting"}
    with WorkerThread(queue.worker(poll_interval=0.02)):
        wait_until(lambda: _statuses(queue, handle.id) == ended, what="the steps to end")
        with queue.engine.begin() as conn:  # pruned by passes that also see the ended steps
            plain = [
                queue.enqueue(conn, "step", {"label": "plain", "fail": fail})
                for fail in (False, True)
            ]
        wait_until(
            lambda: all(queue.get_job(job_id) is None for job_id in plain),
            what="the duty to prune the plain jobs",
        )
        assert _statuses(queue, handle.id) == ended
        assert queue.get_job(handle.job_ids["a"]).result == "result of a"  # type: ignore[union-attr]
        queue.cancel(handle.job_ids["c"])
        wait_until(lambda: count_jobs(queue.engine) == 0, what="the finished workflow pruned")
    assert queue.get_workflow(handle.id) is None


def test_workflow_show_lists_the_steps_in_order_and_jobs_show_names_the_workflow(backend):
    queue, _ = _queue(backend)
    wf = Workflow()
    wf.add("charge", _step("charge"))
    wf.add("mail", _step("mail", fail=True), after=["charge"])
    wf.add("done", _step("done"), after=["mail"])
    handle = _enqueue(queue, wf)
    drain(queue)
    text = cli("workflow", "show", str(handle.id), url=backend.url)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith(f"workflow {handle.id} (on_dead=wait), finished: -")
    assert lines[1] == "blocked by: mail"
    body = "\n".join(lines[2:])
    assert body.index("charge") < body.index("mail") < body.index("done")
    assert "step mail fails" in body
    shown = cli("workflow", "show", str(handle.id), "--json", url=backend.url)
    document = json.loads(shown.stdout)
    assert list(document["steps"]) == ["charge", "mail", "done"]
    assert document["steps"]["mail"]["status"] == "dead"
    assert document["steps"]["mail"]["attempts"] == 1
    assert "step mail fails" in document["steps"]["mail"]["last_error"]
    assert document["steps"]["done"]["after"] == ["mail"]
    assert document["blocked_by"] == ["mail"]
    job_text = cli("jobs", "show", str(handle.job_ids["mail"]), url=backend.url).stdout
    assert f"workflow:         {handle.id}, step 'mail'" in job_text
    job_json = json.loads(
        cli("jobs", "show", str(handle.job_ids["mail"]), "--json", url=backend.url).stdout
    )
    assert job_json["workflow"] == {"id": handle.id, "step": "mail", "replaced_by": None}
    new_id = queue.requeue(handle.job_ids["mail"], by="ops", reason="try again")
    old_text = cli("jobs", "show", str(handle.job_ids["mail"]), url=backend.url).stdout
    assert f"workflow:         {handle.id}, step 'mail', replaced there by job {new_id}" in old_text
    old_json = json.loads(
        cli("jobs", "show", str(handle.job_ids["mail"]), "--json", url=backend.url).stdout
    )
    assert old_json["workflow"] == {"id": handle.id, "step": "mail", "replaced_by": new_id}
    waiting = cli("jobs", "list", "--status", "waiting", "--json", url=backend.url)
    assert waiting.returncode == 0, waiting.stderr
    assert [job["id"] for job in json.loads(waiting.stdout)] == [handle.job_ids["done"]]
    listed = cli("jobs", "list", "--status", "waiting", url=backend.url).stdout
    assert str(handle.job_ids["done"]) in listed
    assert "waiting" in listed
    missing = cli("workflow", "show", "999999", url=backend.url)
    assert (missing.returncode, missing.stderr.strip()) == (
        1,
        "sqlqueue: error: there is no workflow 999999",
    )
