"""2. Workers SIGKILLed mid-job at random moments, and respawned: nothing is lost.

Counts from the ledger, the audit of transitions and the audit of lease changes: every job
finishes an execution (lost = 0); every execution a kill cut short was reaped, and its job ran
again after that reap; a job runs twice, or two of its runs overlap, only after a reap, and no
reap ever took a lease before it expired by the database's clock.

How fast the reaper recovers a killed worker's jobs is a figure (kill -> reap, p50 and p99);
the soak (``-m slow``) also holds it to lease + reaper interval + 1 s at p99, and to "only the
killed workers' jobs ran twice", which on a loaded machine depend on every live worker's
heartbeat coming within its 2 s lease.
"""

from __future__ import annotations

import random
import signal
import time

import pytest
import sqlalchemy as sa

from tests.apps.fault_clock import wall_clock
from tests.apps.processes import wait_until
from tests.faults._harness import (
    Faults,
    FaultWorker,
    history_problems,
    percentile,
    reaps,
    reaps_of_live_leases,
    tally,
)

# Many worker processes at once: under pytest-xdist these modules share one group, so
# two of them never run at the same time on a 2-core machine (see docs/development.md).
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("many_processes")]

LEASE = 2.0
#: A worker's reaper runs every lease/2 seconds (at least 0.5 s), jittered by up to 10 %.
REAPER_INTERVAL = max(LEASE / 2, 0.5) * 1.1
KILLS = 3
CONCURRENCY = 8


def _busy(faults: Faults, pool: list[FaultWorker]) -> list[FaultWorker]:
    """The live workers of ``pool`` that the database says hold a started job now."""
    query = sa.text(
        "SELECT locked_by FROM sqlqueue_jobs WHERE status = 'running' AND started_at IS NOT NULL"
    )
    with faults.engine.connect() as conn:
        owners = conn.execute(query).scalars().all()
    holding = {int(owner.split(":")[1]) for owner in owners if owner}
    return [worker for worker in pool if worker.alive and worker.pid in holding]


def test_sigkilled_workers_lose_no_job(faults: Faults) -> None:
    rng = random.Random()
    processes = 8 if faults.size > 1 else 4
    jobs = 100 * faults.size
    seconds = [round(rng.uniform(0.2, 2.0), 2) for _ in range(jobs)]
    faults.audit_leases()
    pool = faults.start_many(processes, concurrency=CONCURRENCY, lease=LEASE)
    ids = faults.enqueue("fault.sleep", [{"seconds": s} for s in seconds])
    began = time.monotonic()

    drain = sum(seconds) / (processes * CONCURRENCY)
    killed_at: dict[int, float] = {}
    for moment in sorted(rng.uniform(0.5, max(1.5, 0.6 * drain)) for _ in range(KILLS)):
        time.sleep(max(0.0, began + moment - time.monotonic()))
        # A worker in the middle of a job, as the database says: a kill of one that holds none
        # (a respawn still starting, on a slow machine) would test nothing.
        busy = wait_until(
            lambda: _busy(faults, pool),
            timeout=60,
            what="a live worker to hold a started job",
            explain=faults.explain,
        )
        victim = rng.choice(busy)
        victim.send(signal.SIGKILL)
        assert victim.wait(10) == -signal.SIGKILL
        killed_at[victim.pid] = wall_clock()
        pool.append(faults.start(concurrency=CONCURRENCY, lease=LEASE))  # the respawn
    faults.wait_for(jobs, "succeeded", timeout=120 + 3 * drain)
    took = time.monotonic() - began
    faults.stop_all()

    executions = faults.ledger()
    counted = tally(ids, executions, ended=killed_at)
    transitions = faults.transitions()
    changes = faults.lease_changes()
    reaped_jobs = {c.job_id for c in reaps(changes)}
    reaped: dict[int, float] = {}  # job -> seconds from its worker's kill to its recovery
    rerun: list[float] = []  # seconds from the kill to the job's next start
    for t in transitions:
        if t.old_status == "running" and t.new_status == "failed" and t.locked_by:
            killed = killed_at.get(int(t.locked_by.split(":")[1]))
            if killed is not None:
                reaped[t.job_id] = t.at - killed
                later = [
                    e.started for e in executions if e.job_id == t.job_id and e.started > killed
                ]
                rerun += [min(later) - killed] if later else []
    # Every execution the kills cut short was reaped, and its job ran again after the reap.
    cut_short = [e for e in executions if e.finished is None]
    out_of_order = []
    for execution in cut_short:
        reap_at = [
            t.at
            for t in transitions
            if t.job_id == execution.job_id
            and t.attempts == execution.attempt
            and (t.old_status, t.new_status) == ("running", "failed")
        ]
        if not reap_at or not any(
            e.started > reap_at[0] for e in executions if e.job_id == execution.job_id
        ):
            out_of_order.append((execution, reap_at))
    recovery = list(reaped.values())
    bound = LEASE + REAPER_INTERVAL + 1.0
    faults.figure(
        f"{jobs} jobs of 0.2-2 s on {processes}x{CONCURRENCY} slots, {KILLS} SIGKILLs + "
        f"respawns, lease {LEASE:g} s: {counted.line()}; in flight on killed workers "
        f"{len(reaped)}; reaped from live workers (a heartbeat later than the lease) "
        f"{len(reaped_jobs - set(reaped))}; recovery (kill -> reaped) p50 "
        f"{percentile(recovery, 0.5):.2f} s, p99 {percentile(recovery, 0.99):.2f} s (the "
        f"soak's bound {bound:.1f} s); rerun started p99 {percentile(rerun, 0.99):.2f} s after "
        f"the kill; drained in {took:.1f} s",
        lost=len(counted.lost),
        duplicates=len(counted.duplicates),
        in_flight_on_killed=len(reaped),
        recovery_p99=round(percentile(recovery, 0.99), 3),
    )
    assert not counted.lost, faults.describe_jobs(counted.lost)
    assert not history_problems(transitions), history_problems(transitions)[:5]
    assert not reaps_of_live_leases(changes), reaps_of_live_leases(changes)[:5]
    assert cut_short, "the kills cut executions short"
    assert not out_of_order, out_of_order[:5]
    assert set(counted.duplicates) <= reaped_jobs, faults.describe_jobs(
        set(counted.duplicates) - reaped_jobs
    )
    assert set(counted.overlaps) <= reaped_jobs, faults.describe_jobs(
        set(counted.overlaps) - reaped_jobs
    )
    assert {job.status for job in faults.jobs().values()} == {"succeeded"}
    if faults.size > 1:  # the soak's judgement of the machine: every live heartbeat in time
        assert set(counted.duplicates) <= set(reaped), faults.describe_jobs(
            set(counted.duplicates) - set(reaped)
        )
        assert not counted.overlaps, faults.describe_jobs(counted.overlaps)
        assert percentile(recovery, 0.99) <= bound, sorted(recovery)[-5:]
