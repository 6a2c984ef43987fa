"""2. Workers SIGKILLed mid-job at random moments, and respawned: nothing is lost.

Counts from the ledger and the audit: every job finishes an execution (lost = 0); a job runs
twice only if it was in flight on a killed worker (its lease was reaped from that worker);
the reaper recovers such a job within lease + reaper interval + 1 s of the kill (p99).
"""

from __future__ import annotations

import random
import signal
import time

import pytest

from tests.apps.fault_clock import wall_clock
from tests.faults._harness import Faults, history_problems, percentile, tally

# Many worker processes at once: under pytest-xdist these modules share one group, so
# two of them never run at the same time on a 2-core machine (see docs/development.md).
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("many_processes")]

LEASE = 2.0
#: A worker's reaper runs every lease/2 seconds (at least 0.5 s), jittered by up to 10 %.
REAPER_INTERVAL = max(LEASE / 2, 0.5) * 1.1
KILLS = 3
CONCURRENCY = 8


def test_sigkilled_workers_lose_no_job(faults: Faults) -> None:
    rng = random.Random()
    processes = 8 if faults.size > 1 else 4
    jobs = 100 * faults.size
    seconds = [round(rng.uniform(0.2, 2.0), 2) for _ in range(jobs)]
    pool = faults.start_many(processes, concurrency=CONCURRENCY, lease=LEASE)
    ids = faults.enqueue("fault.sleep", [{"seconds": s} for s in seconds])
    began = time.monotonic()

    drain = sum(seconds) / (processes * CONCURRENCY)
    killed_at: dict[int, float] = {}
    for moment in sorted(rng.uniform(0.5, max(1.5, 0.6 * drain)) for _ in range(KILLS)):
        time.sleep(max(0.0, began + moment - time.monotonic()))
        victim = rng.choice([worker for worker in pool if worker.alive])
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
    recovery = list(reaped.values())
    bound = LEASE + REAPER_INTERVAL + 1.0
    faults.figure(
        f"{jobs} jobs of 0.2-2 s on {processes}x{CONCURRENCY} slots, {KILLS} SIGKILLs + "
        f"respawns, lease {LEASE:g} s: {counted.line()}; in flight on killed workers "
        f"{len(reaped)}; recovery (kill -> reaped) p50 {percentile(recovery, 0.5):.2f} s, "
        f"p99 {percentile(recovery, 0.99):.2f} s (bound {bound:.1f} s); rerun started p99 "
        f"{percentile(rerun, 0.99):.2f} s after the kill; drained in {took:.1f} s",
        lost=len(counted.lost),
        duplicates=len(counted.duplicates),
        in_flight_on_killed=len(reaped),
        recovery_p99=round(percentile(recovery, 0.99), 3),
    )
    assert not counted.lost, faults.describe_jobs(counted.lost)
    assert set(counted.duplicates) <= set(reaped), faults.describe_jobs(
        set(counted.duplicates) - set(reaped)
    )
    assert not counted.overlaps, faults.describe_jobs(counted.overlaps)
    assert not history_problems(transitions), history_problems(transitions)[:5]
    assert reaped, "the kills hit jobs in flight"
    assert percentile(recovery, 0.99) <= bound, sorted(recovery)[-5:]
    assert {job.status for job in faults.jobs().values()} == {"succeeded"}
