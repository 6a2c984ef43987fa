"""3. A live job is never reaped; a stalled worker's stale heartbeat and completion change
nothing; the reaper racing a completion never undoes the success.

Counts from the ledger, the audit of transitions, the audit of lease changes and the job rows;
the stalled worker's "lost lease" warnings are read from its log, because being logged is the
promise.

"Live" is what the database says: a lease not yet expired by its clock. On a loaded machine a
heartbeat may come later than a 1 s lease, and reaping that job is then right, so the default
suite asserts what holds whatever the load (no lease reaped before it expired, the heartbeats
extended the leases, the landed outcome is the last attempt's); where it asserts "never
reaped", the reaping is impossible by construction (leases, or reaper intervals, far longer
than the test). "Not one reap with 1 s leases" is a figure of the machine, asserted only by
the soak (``-m slow``).
"""

from __future__ import annotations

import random
import signal
from collections import Counter, defaultdict

import pytest

from tests._support.freezing import freeze_between_transactions
from tests.apps.fault_ledger import LeaseChange
from tests.apps.processes import wait_until
from tests.faults._harness import (
    Faults,
    history_problems,
    percentile,
    reaps,
    reaps_of_live_leases,
    tally,
)

# Many worker processes at once: under pytest-xdist these modules share one group, so
# two of them never run at the same time on a 2-core machine (see docs/development.md).
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("many_processes")]

LEASE = 1.0
#: Seconds far longer than any test here (pytest's timeout is 900 s): a lease that never
#: expires, or a reaper that never runs, while the test lasts.
NEVER = 3600.0
#: The reaper interval of a worker that must reap as soon as a lease expires.
PROMPT_REAPER = 0.1


def _extensions(changes: list[LeaseChange]) -> dict[tuple[int, int, str | None], list[LeaseChange]]:
    """The heartbeats' lease extensions, by attempt (job, attempt, owner)."""
    found: dict[tuple[int, int, str | None], list[LeaseChange]] = defaultdict(list)
    for c in changes:
        if c.old_status == c.new_status == "running" and c.old_lease is not None:
            found[(c.job_id, c.attempts, c.locked_by)].append(c)
    return found


def test_a_job_heartbeating_through_six_leases_runs_once(faults: Faults) -> None:
    """Jobs six leases long, on workers that reap each other's expired leases."""
    processes = 2 if faults.size == 1 else 4
    jobs = 2 * faults.size
    faults.audit_leases()
    faults.start_many(processes, concurrency=jobs // processes, lease=LEASE)
    ids = faults.enqueue("fault.sleep", [{"seconds": 6 * LEASE}] * jobs)
    faults.wait_for(jobs, "succeeded", timeout=60)
    faults.stop_all()

    executions = faults.ledger()
    counted = tally(ids, executions)
    transitions = faults.transitions()
    changes = faults.lease_changes()
    extensions = _extensions(changes)
    reaped = reaps(changes)
    rows = faults.jobs()
    longest = max((e.finished or 0.0) - e.started for e in executions)
    faults.figure(
        f"{jobs} jobs of {6 * LEASE:g} s under a {LEASE:g} s lease, {processes} workers "
        f"reaping each other: {counted.line()}; longest run {longest / LEASE:.1f} leases; "
        f"lease extensions {sum(map(len, extensions.values()))}; reaped {len(reaped)} (each "
        "after a heartbeat came later than the lease)",
        duplicates=len(counted.duplicates),
        reaped=len(reaped),
    )
    assert not reaps_of_live_leases(changes), reaps_of_live_leases(changes)
    assert not history_problems(transitions), history_problems(transitions)[:5]
    for job in rows.values():
        assert job.status == "succeeded", job
        assert job.result["attempt"] == job.attempts, "the landed outcome is the last attempt's"
        assert [e.kind for e in job.errors] == ["LeaseExpired"] * (job.attempts - 1), job.errors
        # The attempt that landed ran six leases, so its heartbeats extended its lease, each
        # time to the database's now plus the lease (precision: SQLite keeps milliseconds).
        landed = extensions[(job.id, job.attempts, job.locked_by)]
        assert landed, faults.describe_jobs([job.id])
        assert all(abs(c.new_lease - c.at - LEASE) < 0.002 for c in landed if c.new_lease)
    assert longest >= 6 * LEASE
    if faults.size > 1:  # the soak's judgement of the machine: every heartbeat in time
        assert counted.spread == (1, 1), faults.describe_jobs(counted.duplicates)
        assert Counter((t.old_status, t.new_status) for t in transitions) == {
            ("queued", "running"): jobs,
            ("running", "succeeded"): jobs,
        }
        assert all(job.errors == () and job.attempts == 1 for job in rows.values())


def test_a_resumed_stalled_worker_changes_nothing_and_logs_lost_leases(faults: Faults) -> None:
    """The stalled worker holds 1 s leases and never reaps (its reaper's interval is far
    longer than the test); its successor reaps at once and holds leases far longer than the
    test. So the only lease that can expire is the one frozen with the stalled worker, and
    each step below is certain, not likely. Each attempt lasts until the test opens its gate:
    attempt 1 resumes while attempt 2 still runs, however slow the machine."""
    jobs = faults.size
    gate = faults.tmp_path / "gate"
    stalled = faults.start_many(
        1, concurrency=jobs, lease=LEASE, env={"FAULT_REAPER_INTERVAL": str(NEVER)}
    )[0]
    assert f"reaper every {NEVER:g} s" in stalled.log(), stalled.describe()
    ids = faults.enqueue("fault.gated", [{"gate": str(gate)}] * jobs)
    wait_until(
        lambda: len(faults.ledger()) == jobs, timeout=30, what="attempt 1 to start everywhere"
    )
    # Frozen mid-job: no heartbeats, no outcome; and between two of its transactions, since
    # frozen in one it would hold its locks (on SQLite the only write lock) while it stays so.
    freeze_between_transactions(stalled, faults.engine)
    try:
        successor = faults.start(
            concurrency=jobs, lease=NEVER, env={"FAULT_REAPER_INTERVAL": str(PROMPT_REAPER)}
        )
        wait_until(
            lambda: sum(e.attempt == 2 for e in faults.ledger()) == jobs,
            timeout=30 + jobs,
            what="the successor to reap the frozen leases and start attempt 2 of every job",
            explain=faults.explain,
        )
    finally:
        stalled.send(signal.SIGCONT)  # its handlers go on, gated; its heartbeats follow
    wait_until(
        lambda: all(f"lost the lease on running job {job_id} " in stalled.log() for job_id in ids),
        timeout=30,
        what="the resumed worker's heartbeat to find every lease gone and say so",
        explain=stalled.describe,
    )
    gate.with_suffix(".1").touch()  # attempt 1 ends now, while attempt 2 still runs
    wait_until(
        lambda: stalled.log().count("so this attempt's outcome was discarded") == jobs,
        timeout=30,
        what="the stalled worker to try (and fail) to record every attempt 1",
        explain=stalled.describe,
    )
    log = stalled.log()
    lost_beats = log.count("lost the lease on running job")
    right_after = faults.jobs()
    gate.with_suffix(".2").touch()
    faults.wait_for(jobs, "succeeded", timeout=30)
    faults.stop_all()

    at = f":{successor.pid}:"
    for job in right_after.values():
        assert (job.status, job.attempts) == ("running", 2), job
        assert at in (job.locked_by or ""), job
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
    assert counted.overlaps == tuple(ids), "attempt 1 ran on while attempt 2 did"
    assert not history_problems(transitions)


def test_the_reaper_racing_completions_never_undoes_a_success(faults: Faults) -> None:
    """Attempt 1 of each job ends around its lease's expiry, with heartbeats off: completions
    and reaps race. Whoever wins, a success stays a success, the landed result is the last
    attempt's, and no lease is reaped before it expired; that both sides won some races is a
    matter of the machine's speed, asserted by the soak only."""
    rng = random.Random()
    jobs = 40 * faults.size
    # Few workers with many slots: a worker often re-claims the very job whose lease its own
    # reaper just took while the stale attempt still runs, so it holds two attempts of it.
    processes = 2 if faults.size == 1 else 4
    env = {"FAULT_NO_HEARTBEAT": "1"}  # every lease runs out at LEASE: the race is on
    faults.audit_leases()
    faults.start_many(processes, concurrency=24, lease=LEASE, env=env)
    # Attempt 1 ends around its lease's expiry; later attempts at once. The spread reaches well
    # before and well past the expiry, so both sides usually win some races on a loaded
    # machine too (0.8-1.5 leases once saw the reaper win all 40 and, in another run, none).
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
    changes = faults.lease_changes()
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
    assert not reaps_of_live_leases(changes), reaps_of_live_leases(changes)[:5]
    assert {job.status for job in rows.values()} == {"succeeded"}
    for job in rows.values():
        assert job.result["attempt"] == job.attempts, "the landed result is the last attempt's"
        reaps_of_job = [e.kind for e in job.errors]
        assert reaps_of_job == ["LeaseExpired"] * (job.attempts - 1), (job.id, reaps_of_job)
    if faults.size > 1:  # the soak's judgement: on this machine both sides won races
        assert won, "some completions beat the reaper"
        assert reaped_at, "the reaper beat some completions"
