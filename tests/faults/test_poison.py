"""7. Poison input at run time: a job whose payload no longer fits its handler's signature ->
dead at once with a clear error; a job whose handler was removed after it was enqueued -> left
queued, untouched (workers claim only the types they have tasks for; health raises
``unknown_type``); with 10 % poison jobs in the queue, healthy throughput drops by at most 10 %.

Enqueue-time poison (sets, bytes, datetimes, NaN, lone surrogates, deep nesting, oversize,
unknown types) is covered by ``tests/test_bad_input.py``. Throughput is measured from the
ledger, against a clean run of the same healthy jobs on the same worker processes. It is a
figure of the machine (two processes sharing a loaded one rarely get equal shares): the
default suite asserts what happens to each job, the soak (``-m slow``) holds the drop to 10 %.
"""

from __future__ import annotations

import random

import pytest

import sqlqueue
from tests.apps.fault_ledger import Execution
from tests.faults._harness import Faults, tally

pytestmark = pytest.mark.timeout(900)

HEALTHY = 160
#: Seconds of work per healthy job: workers are bound by their slots, as with real handlers
#: (with no-op jobs on a small machine the figure would measure CPU noise instead).
WORK = 0.1
SLOTS = 4


def _producer(faults: Faults) -> sqlqueue.Queue:
    """The app as it was when the poison jobs were enqueued (the workers run a newer one)."""
    producer = faults.backend.queue()

    @producer.task("fault.removed")
    def removed() -> None:
        """A task the workers no longer have."""

    @producer.task("fault.resize")
    def resize_v1(image_id: int) -> None:
        """Version 1: the workers' version 2 also needs ``width``."""

    _ = (removed, resize_v1)
    return producer


def _rate(executions: list[Execution], ids: set[int]) -> float:
    mine = [e for e in executions if e.job_id in ids]
    span = max(e.finished or e.started for e in mine) - min(e.started for e in mine)
    return len(mine) / span


def test_poison_jobs_die_clearly_and_barely_slow_the_rest(faults: Faults) -> None:
    """Two workers run at the same time on the same machine, so load hits both alike: one
    drains a queue of healthy jobs, the other the same healthy jobs with 10 % poison mixed in."""
    healthy = HEALTHY * faults.size
    poisoned = healthy // 9  # 10 % of the mixed queue's jobs
    faults.wait_ready(
        [faults.start(concurrency=SLOTS, queues=[name]) for name in ("clean", "mixed")]
    )
    producer = _producer(faults)
    work = {"seconds": WORK}
    clean_requests = [
        sqlqueue.JobRequest(job_type="fault.sleep", payload=work, queue="clean", external=True)
        for _ in range(healthy)
    ]
    mixed_requests = [
        sqlqueue.JobRequest(job_type="fault.sleep", payload=work, queue="mixed", external=True)
        for _ in range(healthy)
    ] + [
        sqlqueue.JobRequest(job_type="fault.removed", queue="mixed")
        if n % 2
        else sqlqueue.JobRequest(job_type="fault.resize", payload={"image_id": n}, queue="mixed")
        for n in range(poisoned)
    ]
    random.shuffle(mixed_requests)
    with faults.engine.begin() as conn:
        ids = producer.enqueue_many(conn, clean_requests + mixed_requests)
    clean, mixed = ids[:healthy], ids[healthy:]
    removed = poisoned // 2  # the odd n: fault.removed, which no worker has a task for
    faults.wait_for(2 * healthy + poisoned - removed, "succeeded", "dead", timeout=60 + healthy / 5)
    faults.stop_all()

    rows = faults.jobs()
    executions = faults.ledger()
    poison = [job_id for job_id in mixed if rows[job_id].job_type != "fault.sleep"]
    survivors = {job_id for job_id in mixed if rows[job_id].job_type == "fault.sleep"}
    clean_rate = _rate(executions, set(clean))
    mixed_rate = _rate(executions, survivors)
    drop = 1 - mixed_rate / clean_rate
    counted = tally([*clean, *survivors], executions)
    faults.figure(
        f"{healthy} healthy jobs of {WORK * 1000:g} ms per worker of {SLOTS} slots, at the "
        f"same time: clean queue {clean_rate:,.0f} jobs/s, queue with {len(poison)} poison jobs "
        f"(10 %) mixed in {mixed_rate:,.0f} jobs/s: "
        f"drop {drop * 100:+.1f} %; poison dead {sum(rows[j].status == 'dead' for j in poison)}"
        f"/{len(poison) - removed} after 1 attempt, left queued "
        f"{sum(rows[j].status == 'queued' for j in poison)}/{removed}; healthy {counted.line()}",
        throughput_drop=round(drop, 4),
    )
    for job_id in poison:
        job = rows[job_id]
        if job.job_type == "fault.removed":
            assert (job.status, job.attempts, job.last_error) == ("queued", 0, None), job
        else:
            assert (job.status, job.attempts) == ("dead", 1), job
            assert job.last_error is not None
            assert job.errors[-1].kind == "PayloadMismatch"
            assert "the payload does not fit fault.resize(" in job.last_error
            assert "missing a required argument: 'width'" in job.last_error
    assert not any(e.job_id in set(poison) for e in executions), "no poison reached a handler"
    assert counted.spread == (1, 1)
    if faults.size > 1:  # the soak's judgement, over 20 times the jobs
        assert drop <= 0.10, f"healthy throughput dropped {drop:.1%}"
