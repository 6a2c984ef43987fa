"""10. Graceful shutdown with jobs in flight around the grace period, read from the audit of
job transitions: no job ends both succeeded and failed, nothing is claimed after the signal,
jobs still running at the deadline go back to the queue without using an attempt.

The rest of the shutdown promises (exit 0, short jobs finish, a second signal forces exit) are
covered by ``tests/test_processes.py``.
"""

from __future__ import annotations

import signal
from collections import Counter

import pytest

from tests.apps.fault_clock import wall_clock
from tests.faults._harness import Faults, history_problems, tally

# Many worker processes at once: under pytest-xdist these modules share one group, so
# two of them never run at the same time on a 2-core machine (see docs/development.md).
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("many_processes")]

GRACE = 1.5


def test_shutdown_never_ends_a_job_both_succeeded_and_failed(faults: Faults) -> None:
    in_flight = 8 * faults.size
    # Spread around the grace period: some end well before it, some right at it, some after.
    seconds = [round(0.3 + 2.7 * n / (in_flight - 1), 2) for n in range(in_flight)]
    (first,) = faults.start_many(1, concurrency=in_flight, shutdown_timeout=GRACE)
    ids = faults.enqueue("fault.sleep", [{"seconds": s} for s in seconds])
    backlog = faults.enqueue("fault.noop", [{}] * 4, priority=5)
    faults.wait_until_started(in_flight)
    signalled = faults.db_now()
    first.send(signal.SIGTERM)
    assert first.wait(GRACE + 15) == 0, first.describe()
    exited = wall_clock()
    faults.start_many(1, concurrency=in_flight)
    faults.wait_for(in_flight + len(backlog), "succeeded", timeout=60)
    faults.stop_all()

    transitions = faults.transitions()
    mine = f":{first.pid}:"
    late_claims = [
        t
        for t in transitions
        if t.new_status == "running" and mine in (t.locked_by or "") and t.at > signalled
    ]
    released = [
        t.job_id for t in transitions if (t.old_status, t.new_status) == ("running", "queued")
    ]
    endings = {
        job_id: Counter(t.new_status for t in transitions if t.job_id == job_id) for job_id in ids
    }
    both = [j for j, c in endings.items() if c["succeeded"] and (c["failed"] or c["dead"])]
    finished_first = [
        j
        for j in ids
        if any(
            t.job_id == j and t.new_status == "succeeded" and mine in (t.locked_by or "")
            for t in transitions
        )
    ]
    rows = faults.jobs()
    counted = tally(ids, faults.ledger(), ended={first.pid: exited})
    faults.figure(
        f"{in_flight} jobs of 0.3-3 s in flight at SIGTERM, grace {GRACE:g} s: finished in "
        f"the grace {len(finished_first)}, released {len(released)} (attempts back to 0), "
        f"both succeeded and failed {len(both)}, claims after the signal {len(late_claims)}; "
        f"after a second worker: {counted.line()}",
        both=len(both),
        late_claims=len(late_claims),
        released=len(released),
    )
    assert not both
    assert not late_claims
    assert not history_problems(transitions), history_problems(transitions)[:5]
    assert finished_first, "jobs shorter than the grace finished in it"
    assert released, "jobs longer than the grace were released"
    assert all(t.attempts == 0 for t in transitions if t.new_status == "queued")
    assert {(rows[j].status, rows[j].attempts) for j in [*ids, *backlog]} == {("succeeded", 1)}
    assert not counted.lost
