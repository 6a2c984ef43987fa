"""Per-key ordering across worker processes, through a SIGKILL: zero overlaps within a key.

Only the worker that is killed holds short leases, and no reaper runs before it is killed: the
jobs reaped are its own, after its death, whatever the machine's speed. (With 2 s leases in
every worker, a loaded machine could reap a live job, whose next run then overlapped it.)
"""

from __future__ import annotations

import itertools
import signal
import time
from collections import defaultdict
from typing import Any

import sqlqueue
from tests.apps.ledger import create_ledger, read_ledger, register_ledger_tasks
from tests.apps.processes import wait_until

GROUPS = 6
PER_GROUP = 8
#: Seconds far longer than the test: a lease that never expires, and a reaper interval that
#: never comes, while it runs.
NEVER = 3600.0
#: The lease of the worker that is killed: its jobs come back this long after its death.
DOOMED_LEASE = 2.0
#: The victim job's queue, which only the doomed worker serves until it is killed.
VICTIM_QUEUE = "victim"


def test_no_two_jobs_of_a_key_overlap_even_when_a_worker_is_killed(backend, workers):
    create_ledger(backend.engine)
    producer: Any = sqlqueue.Queue(backend.engine)
    register_ledger_tasks(producer)
    options = ("--concurrency", "4", "--poll-interval", "0.05")
    both_queues = ("--queues", f"default,{VICTIM_QUEUE}")
    doomed = workers.start(
        *options, *both_queues, lease_seconds=DOOMED_LEASE, reaper_interval=NEVER
    )
    started = [doomed] + [
        workers.start(*options, lease_seconds=NEVER, reaper_interval=NEVER) for _ in range(3)
    ]
    for worker in started:
        worker.wait_ready()
        assert f"reaper every {NEVER:g} s" in worker.log(), worker.describe()

    victim_key = "g0-n1"
    with backend.engine.begin() as conn:
        for n in range(PER_GROUP):
            for g in range(GROUPS):
                key = f"g{g}-n{n}"
                producer.enqueue(
                    conn,
                    "ledger.sleep",
                    # The victim hangs on attempt 1 until its worker is killed.
                    {
                        "key": key,
                        "seconds": 0.05,
                        **({"first_seconds": 60} if key == victim_key else {}),
                    },
                    idempotency_key=key,
                    group_key=f"group:{g}",
                    # Only the doomed worker serves it: its attempt 1 holds a short lease.
                    **({"queue": VICTIM_QUEUE} if key == victim_key else {}),
                )

    def victim_row():
        return next(
            (
                row
                for row in read_ledger(backend.engine)
                if row.finished is None
                and row.attempt == 1
                and producer.store.get_job(row.job_id).idempotency_key == victim_key
            ),
            None,
        )

    row = wait_until(victim_row, timeout=30, what="the victim job to start")
    assert row.pid == doomed.pid
    doomed.send(signal.SIGKILL)
    killed_at = time.time()
    assert doomed.wait(10) == -signal.SIGKILL
    # The one reaper of the test: it takes the doomed worker's leases once they expire, and
    # every lease it and the others hold outlasts the test.
    rescuer = workers.start(*options, *both_queues, lease_seconds=NEVER, reaper_interval=0.1)
    rescuer.wait_ready()
    assert "reaper every 0.1 s" in rescuer.log(), rescuer.describe()

    total = GROUPS * PER_GROUP

    def all_done() -> bool:
        with backend.engine.connect() as conn:
            done = conn.exec_driver_sql(
                "SELECT count(*) FROM sqlqueue_jobs WHERE status = 'succeeded'"
            ).scalar_one()
        return bool(done == total)

    wait_until(all_done, timeout=90, what="every job to succeed")

    ledger = read_ledger(backend.engine)
    jobs: dict[int, Any] = {
        job_id: producer.get_job(job_id) for job_id in {r.job_id for r in ledger}
    }
    by_group: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for entry in ledger:
        end = entry.finished if entry.finished is not None else killed_at
        by_group[jobs[entry.job_id].group_key].append((entry.started, end, entry.job_id))
    overlaps = 0
    for runs in by_group.values():
        runs.sort()
        for (_, previous_end, _), (start, _, _) in itertools.pairwise(runs):
            if start < previous_end:
                overlaps += 1
        first_starts = []
        for _, _, job_id in runs:
            if job_id not in first_starts:
                first_starts.append(job_id)
        assert first_starts == sorted(first_starts), "a key's jobs ran out of enqueue order"
    victim = jobs[next(j for j, job in jobs.items() if job.idempotency_key == victim_key)]
    print(
        f"\n    [{backend.name}] {total} jobs, {GROUPS} keys, 5 worker processes, one "
        f"SIGKILLed mid-job: {overlaps} overlaps within a key; the killed job finished on attempt "
        f"{victim.attempts}"
    )
    assert overlaps == 0
    assert len(by_group) == GROUPS
    assert victim.attempts == 2
    assert victim.errors[-1].kind == "LeaseExpired"
