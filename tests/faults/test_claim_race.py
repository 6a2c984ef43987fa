"""1. Double-claim race: many worker processes claim at once, with the window between a row
being read as due and it being leased widened by a hook in every worker process.

Counts: executions per job (ledger), rows per claim against its limit (claim log), claims per
job and attempts (audit of transitions, job rows). Guards against a claim that reads rows
without locking them, or leases a row that stopped being claimable meanwhile.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
import sqlalchemy as sa

from tests.apps.fault_ledger import read_claims
from tests.faults._harness import Faults, history_problems, tally

pytestmark = pytest.mark.timeout(900)

JOBS = 250
#: Seconds each candidate row costs the claim's SELECT in every worker.
PAUSE = 0.002
#: Claim limits: a worker claims at most its free slots.
BATCHES = (1, 10)


def test_concurrent_claims_hand_each_job_to_one_worker(faults: Faults) -> None:
    """Half the processes claim one job at a time (concurrency 1), half up to ten."""
    many_writers = faults.backend.capable("row_locks")
    processes = (16 if many_writers else 6) if faults.size > 1 else 4
    jobs = JOBS * faults.size
    env = {"FAULT_CLAIM_PAUSE": str(PAUSE), "FAULT_RECORD_CLAIMS": "1"}
    workers = [
        faults.start(concurrency=BATCHES[n % 2], poll=0.02, env=env) for n in range(processes)
    ]
    faults.wait_ready(workers)
    assert all("claim select pauses" in w.log() for w in workers), faults.explain()

    began = time.monotonic()
    ids = faults.enqueue("fault.noop", [{}] * jobs)  # all due at once: every worker races
    faults.wait_for(jobs, "succeeded", timeout=60 + jobs / 20)
    took = time.monotonic() - began
    faults.stop_all()

    counted = tally(ids, faults.ledger())
    claims = read_claims(faults.engine)
    over_limit = [dict(c) for c in claims if c["returned"] > c["claim_limit"]]
    transitions = faults.transitions()
    claimed = Counter(t.job_id for t in transitions if t.new_status == "running")
    # A job held ahead behind a slow one goes back to the queue after 0.5 s (claim-ahead), and
    # then another claim takes it: a release, not a race, and no attempt is counted for it.
    released = Counter(
        t.job_id for t in transitions if (t.old_status, t.new_status) == ("running", "queued")
    )
    rows = faults.jobs()
    per_pid = Counter(c["pid"] for c in claims)
    largest = {
        b: max((c["returned"] for c in claims if c["claim_limit"] <= b), default=0) for b in BATCHES
    }
    faults.figure(
        f"{jobs} jobs, {processes} processes claiming 1 or up to 10 at a time, select widened "
        f"{PAUSE * 1000:g} ms/row: {counted.line()}; {len(claims)} claims, largest "
        f"{largest[1]} (limit 1) / {largest[10]} (limit 10), over limit {len(over_limit)}; "
        f"claims per job {min(claimed.values())}..{max(claimed.values())} "
        f"(held jobs released {sum(released.values())}); "
        f"{jobs / took:,.0f} jobs/s; claims per process {sorted(per_pid.values())}",
        duplicates=len(counted.duplicates),
        lost=len(counted.lost),
        over_limit=len(over_limit),
        jobs_per_second=round(jobs / took),
    )
    assert not counted.lost
    assert not counted.duplicates, faults.describe_jobs(counted.duplicates)
    assert counted.spread == (1, 1)
    assert not over_limit, over_limit[:5]
    assert sum(c["returned"] for c in claims) == jobs + sum(released.values()), (
        "every claimed row was counted once"
    )
    assert all(count == 1 + released[job_id] for job_id, count in claimed.items()), (
        "each job was claimed exactly once, and once more after each release of it"
    )
    assert not history_problems(transitions)
    assert {(job.status, job.attempts) for job in rows.values()} == {("succeeded", 1)}
    assert all(job.attempts <= job.max_attempts for job in rows.values())
    # Several processes claimed, so they really raced; on 2 loaded cores one of them can find
    # the CI-sized queue drained before its first claim, so all of them is not required.
    assert len(per_pid) >= min(processes, 2), "several processes claimed: they really raced"


def test_attempts_above_max_attempts_are_refused_by_the_database(faults: Faults) -> None:
    (job_id,) = faults.enqueue("fault.noop", [{}], max_attempts=2)
    bump = sa.text("UPDATE sqlqueue_jobs SET attempts = max_attempts + 1 WHERE id = :id")
    # PyMySQL raises MariaDB's CHECK failure (4025) as OperationalError, not IntegrityError.
    refused = "(?i)check constraint|ck_sqlqueue_jobs_attempts"
    with pytest.raises(sa.exc.DBAPIError, match=refused), faults.engine.begin() as conn:
        conn.execute(bump, {"id": job_id})
    job = faults.queue.get_job(job_id)
    assert job is not None
    assert job.attempts == 0
