"""3. A live job is never reaped; a stalled worker's stale heartbeat and completion change
nothing; the reaper racing a completion never undoes the success.

Counts from the ledger, the audit of transitions and the job rows; the stalled worker's
"lost lease" warnings are read from its log, because being logged is the promise.
"""

from __future__ import annotations

import random
import signal
from collections import Counter

import pytest

from tests.apps.processes import wait_until
from tests.faults._harness import Faults, history_problems, percentile, tally

# Many worker processes at once: under pytest-xdist these modules share one group, so
# two of them never run at the same time on a 2-core machine (see docs/development.md).
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("many_processes")]

LEASE = 1.0


def test_a_job_heartbeating_through_six_leases_runs_once(faults: Faults) -> None:
    processes = 2 if faults.size == 1 else 4
    jobs = 2 * faults.size
    faults.start_many(processes, concurrency=jobs // processes, lease=LEASE)
    ids = faults.enqueue("fault.sleep", [{"seconds": 6 * LEASE}] * jobs)
    faults.wait_for(jobs, "succeeded", timeout=60)
    faults.stop_all()

    executions = faults.ledger()
    counted = tally(ids, executions)
    transitions = faults.transitions()
    longest = max((e.finished or 0.0) - e.started for e in executions)
    faults.figure(
        f"{jobs} jobs of {6 * LEASE:g} s under a {LEASE:g} s lease, {processes} workers "
        f"reaping each other: {counted.line()}; longest run {longest / LEASE:.1f} leases; "
        f"reaped {sum(t.new_status == 'failed' for t in transitions)}",
        duplicates=len(counted.duplicates),
        reaped=sum(t.new_status == "failed" for t in transitions),
    )
    assert counted.spread == (1, 1), faults.describe_jobs(counted.duplicates)
    assert Counter((t.old_status, t.new_status) for t in transitions) == {
        ("queued", "running"): jobs,
        ("running", "succeeded"): jobs,
    }
    assert all(job.errors == () and job.attempts == 1 for job in faults.jobs().values())
    assert longest >= 6 * LEASE


def test_a_resumed_stalled_worker_changes_nothing_and_logs_lost_leases(faults: Faults) -> None:
    jobs = faults.size
    stalled = faults.start_many(1, concurrency=jobs, lease=LEASE)[0]
    ids = faults.enqueue("fault.sleep", [{"seconds": 3.0, "first_seconds": 2.5}] * jobs)
    wait_until(
        lambda: len(faults.ledger()) == jobs, timeout=30, what="attempt 1 to start everywhere"
    )
    stalled.send(signal.SIGSTOP)  # frozen mid-job: no heartbeats, no outcome
    successor = faults.start(concurrency=jobs, lease=LEASE)
    wait_until(
        lambda: sum(e.attempt == 2 for e in faults.ledger()) == jobs,
        timeout=30 + jobs,
        what="the successor to start attempt 2 of every job",
        explain=faults.explain,
    )
    stalled.send(signal.SIGCONT)  # its handlers go on; heartbeats and completions follow
    wait_until(
        lambda: stalled.log().count("so this attempt's outcome was discarded") == jobs,
        timeout=30,
        what="the stalled worker to try (and fail) to record every attempt 1",
        explain=stalled.describe,
    )
    log = stalled.log()
    lost_beats = log.count("lost the lease on running job")
    right_after = faults.jobs()
    faults.wait_for(jobs, "succeeded", timeout=30)
    faults.stop_all()

    at = f":{successor.pid}:"
    assert all(job.attempts == 2 and at in (job.locked_by or "") for job in right_after.values())
    rows = faults.jobs()
    assert {job.result["attempt"] for job in rows.values()} == {2}, "attempt 1 never landed"
    assert {job.result["pid"] for job in rows.values()} == {successor.pid}
    transitions = faults.transitions()
    for job_id in ids:
        path = [
            (t.old_status, t.new_status, t.attempts, int((t.locked_by or "::").split(":")[1]))
            for t in transitions
            if t.job_id == job_id
        ]
        assert path == [
            ("queued", "running", 1, stalled.pid),
            ("running", "failed", 1, stalled.pid),  # the reaper; owner kept for the record
            ("failed", "running", 2, successor.pid),
            ("running", "succeeded", 2, successor.pid),
        ], path
    counted = tally(ids, faults.ledger())
    faults.figure(
        f"{jobs} job(s) of a worker SIGSTOPped past its {LEASE:g} s lease and resumed "
        f"mid-attempt-2: {counted.line()} (attempt 1 finished after the takeover, "
        f"{len(counted.overlaps)} overlapping); stale heartbeats logged as lost {lost_beats}, "
        f"stale completions discarded and logged {jobs}/{jobs}; landed outcomes from the "
        "stalled worker 0",
        stale_heartbeat_warnings=lost_beats,
    )
    assert lost_beats >= 1, "the resumed worker's heartbeat found the lease gone and said so"
    assert not history_problems(transitions)


def test_the_reaper_racing_completions_never_undoes_a_success(faults: Faults) -> None:
    rng = random.Random()
    jobs = 40 * faults.size
    # Few workers with many slots: a worker often re-claims the very job whose lease its own
    # reaper just took while the stale attempt still runs, so it holds two attempts of it.
    processes = 2 if faults.size == 1 else 4
    env = {"FAULT_NO_HEARTBEAT": "1"}  # every lease runs out at LEASE: the race is on
    faults.start_many(processes, concurrency=24, lease=LEASE, env=env)
    # Attempt 1 ends around its lease's expiry; later attempts at once. The spread reaches well
    # before and well past the expiry, so both sides win some races on a loaded machine too
    # (0.8-1.5 leases once saw the reaper win all 40 and, in another run, none).
    payloads = [
        {"seconds": 0, "first_seconds": round(rng.uniform(0.4, 2.0) * LEASE, 2), "step": 0.01}
        for _ in range(jobs)
    ]
    ids = faults.enqueue("fault.sleep", payloads, max_attempts=20)
    faults.wait_for(jobs, "succeeded", timeout=60 + jobs / 5)
    faults.stop_all()

    rows = faults.jobs()
    transitions = faults.transitions()
    executions = faults.ledger()
    reaped_at = {
        t.job_id: t.at for t in transitions if (t.old_status, t.new_status) == ("running", "failed")
    }
    margins = [  # how close each lost race was: attempt 1's handler end minus the reap
        abs(e.finished - reaped_at[e.job_id])
        for e in executions
        if e.attempt == 1 and e.job_id in reaped_at and e.finished is not None
    ]
    won = sum(job.attempts == 1 for job in rows.values())
    twice_here = sum(  # reaped jobs whose next attempt ran in the same worker process
        len({e.pid for e in executions if e.job_id == job_id}) == 1 for job_id in reaped_at
    )
    faults.figure(
        f"{jobs} jobs ending around their {LEASE:g} s lease with heartbeats off: completion "
        f"first {won}, reaper first {len(reaped_at)}; closest race {min(margins or [0]):.3f} "
        f"s, races within 0.1 s {sum(m < 0.1 for m in margins)}, p50 margin "
        f"{percentile(margins, 0.5):.3f} s; re-claimed by the stalled worker itself "
        f"{twice_here}; {tally(ids, executions).line()}",
        completion_first=won,
        reaper_first=len(reaped_at),
        same_worker=twice_here,
    )
    assert not history_problems(transitions), history_problems(transitions)[:5]
    assert {job.status for job in rows.values()} == {"succeeded"}
    for job in rows.values():
        assert job.result["attempt"] == job.attempts, "the landed result is the last attempt's"
        reaps = [e.kind for e in job.errors]
        assert reaps == ["LeaseExpired"] * (job.attempts - 1), (job.id, reaps)
    assert won, "some completions beat the reaper"
    assert reaped_at, "the reaper beat some completions"
