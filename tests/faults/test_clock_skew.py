"""8. Clock skew: worker processes whose own clock is an hour ahead or behind neither run jobs
early nor reap live jobs, because every time that matters comes from the database.

The skew is installed in the worker process before sqlqueue is imported (``time.time``,
``time.time_ns``, ``datetime.now/utcnow/today``; see ``tests/apps/fault_clock.py``). Each
ledger row keeps both the true start and the worker's own reading, which proves the skew.

The lease is far longer than the test, so by the database's clock no job can be reaped while
it runs, and far shorter than the skew, so a reaper or a claim on a worker's clock would reap
every job at once; the workers' reapers run every 0.1 s, so they would. The audit of lease
changes shows each lease written from the database's clock.
"""

from __future__ import annotations

import pytest

from tests.faults._harness import Faults, reaps, tally

pytestmark = pytest.mark.timeout(900)

SKEW = 3600.0
#: Far longer than the test (its waits give up after a few minutes at most), far shorter than
#: the skew.
LEASE = 600.0
DELAY = 2.0
#: Seconds each long job runs: many passes of every worker's reaper.
LONG_JOB = 3.0


def test_workers_with_skewed_clocks_neither_run_early_nor_reap_live_jobs(
    faults: Faults,
) -> None:
    faults.audit_leases()
    skews = {}
    for skew in (SKEW, -SKEW):
        env = {"FAULT_CLOCK_SKEW_SECONDS": str(skew), "FAULT_REAPER_INTERVAL": "0.1"}
        worker = faults.start(concurrency=4 * faults.size, lease=LEASE, env=env)
        skews[worker.pid] = skew
    faults.wait_ready(faults.workers)
    assert all("reaper every 0.1 s" in w.log() for w in faults.workers), faults.explain()
    delayed = faults.enqueue("fault.noop", [{}] * (8 * faults.size), delay=DELAY)
    long = faults.enqueue("fault.sleep", [{"seconds": LONG_JOB}] * (4 * faults.size))
    faults.wait_for(len(delayed) + len(long), "succeeded", timeout=60)
    faults.stop_all()

    rows = faults.jobs()
    executions = faults.ledger()
    changes = faults.lease_changes()
    early = [
        e.started - rows[e.job_id].next_run_at.timestamp()
        for e in executions
        if e.job_id in set(delayed)
    ]
    seen = {e.pid: e.clock - e.started for e in executions}
    counted = tally(long, executions)
    claims = [c for c in changes if c.new_status == "running" and c.old_status != "running"]
    lease_offsets = [c.new_lease - c.at for c in claims if c.new_lease is not None]
    faults.figure(
        f"workers {SKEW / 60:+.0f}/{-SKEW / 60:+.0f} min off (clocks seen "
        f"{sorted(round(v) for v in seen.values())} s): {len(delayed)} jobs due in "
        f"{DELAY:g} s started {min(early) * 1000:+.0f} ms after due at the earliest; "
        f"{len(long)} jobs of {LONG_JOB:g} s under reapers every 0.1 s: {counted.line()}; "
        f"reaped {len(reaps(changes))}; leases written {len(claims)}, each "
        f"{min(lease_offsets):.3f}..{max(lease_offsets):.3f} s past the database's now",
        earliest_start_ms=round(min(early) * 1000, 1),
        reaped=len(reaps(changes)),
    )
    assert set(seen) == set(skews), "both skewed workers ran jobs"
    for pid, offset in seen.items():
        assert abs(offset - skews[pid]) < 1.0, "the worker's own clock really was off"
    assert min(early) >= -0.002, "no job started before it was due (database clock)"
    # Each claim's lease is the database's now plus the lease (precision: SQLite keeps
    # milliseconds); a worker's clock would put it an hour off.
    assert claims, "the workers claimed"
    assert len(lease_offsets) == len(claims)
    assert all(abs(offset - LEASE) < 0.002 for offset in lease_offsets), lease_offsets
    assert not reaps(changes), reaps(changes)
    assert counted.spread == (1, 1), faults.describe_jobs(counted.duplicates)
    assert all(rows[j].errors == () and rows[j].attempts == 1 for j in long)
