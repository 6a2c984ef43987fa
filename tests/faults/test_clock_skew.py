"""8. Clock skew: worker processes whose own clock is 10 minutes ahead or behind neither run
jobs early nor reap live jobs, because every time that matters comes from the database.

The skew is installed in the worker process before sqlqueue is imported (``time.time``,
``time.time_ns``, ``datetime.now/utcnow/today``; see ``tests/apps/fault_clock.py``). Each
ledger row keeps both the true start and the worker's own reading, which proves the skew.
"""

from __future__ import annotations

import pytest

from tests.faults._harness import Faults, tally

pytestmark = pytest.mark.timeout(900)

SKEW = 600.0
LEASE = 1.0
DELAY = 2.0


def test_workers_with_skewed_clocks_neither_run_early_nor_reap_live_jobs(
    faults: Faults,
) -> None:
    skews = {}
    for skew in (SKEW, -SKEW):
        env = {"FAULT_CLOCK_SKEW_SECONDS": str(skew)}
        worker = faults.start(concurrency=4 * faults.size, lease=LEASE, env=env)
        skews[worker.pid] = skew
    faults.wait_ready(faults.workers)
    delayed = faults.enqueue("fault.noop", [{}] * (8 * faults.size), delay=DELAY)
    long = faults.enqueue("fault.sleep", [{"seconds": 3 * LEASE}] * (4 * faults.size))
    faults.wait_for(len(delayed) + len(long), "succeeded", timeout=60)
    faults.stop_all()

    rows = faults.jobs()
    executions = faults.ledger()
    early = [
        e.started - rows[e.job_id].next_run_at.timestamp()
        for e in executions
        if e.job_id in set(delayed)
    ]
    seen = {e.pid: e.clock - e.started for e in executions}
    counted = tally(long, executions)
    faults.figure(
        f"workers {SKEW / 60:+.0f}/{-SKEW / 60:+.0f} min off (clocks seen "
        f"{sorted(round(v) for v in seen.values())} s): {len(delayed)} jobs due in "
        f"{DELAY:g} s started {min(early) * 1000:+.0f} ms after due at the earliest; "
        f"{len(long)} jobs of {3 * LEASE:g} leases: {counted.line()}; reaped "
        f"{sum(bool(rows[j].errors) for j in long)}",
        earliest_start_ms=round(min(early) * 1000, 1),
        reaped=sum(bool(rows[j].errors) for j in long),
    )
    assert set(seen) == set(skews), "both skewed workers ran jobs"
    for pid, offset in seen.items():
        assert abs(offset - skews[pid]) < 1.0, "the worker's own clock really was off"
    assert min(early) >= -0.002, "no job started before it was due (database clock)"
    assert counted.spread == (1, 1), faults.describe_jobs(counted.duplicates)
    assert all(rows[j].errors == () and rows[j].attempts == 1 for j in long)
