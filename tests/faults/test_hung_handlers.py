"""6. Hung handlers: an async handler that never returns, a sync one blocked in a socket
read, a CPU loop -> each attempt ends at its timeout, no slot is lost, the queue keeps flowing.

Counts from the ledger (executions and how many ran at once) and the job rows (each attempt's
error and its measured length). How long past its timeout an attempt ended, and how many
healthy jobs ran at once after the last hang, are figures (the machine's speed decides them);
that every slot serves again is shown by as many gated jobs running at once.
"""

from __future__ import annotations

import socket

import pytest

import sqlqueue
from tests.faults._harness import Faults, percentile, poll, tally

pytestmark = pytest.mark.timeout(900)

TIMEOUT = 0.5
CONCURRENCY = 3


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals that overlap at one instant."""
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = peak = 0
    for _, step in edges:
        running += step
        peak = max(peak, running)
    return peak


@pytest.mark.interrupts_handler_threads
def test_hung_handlers_end_at_their_timeout_and_the_queue_flows(faults: Faults) -> None:
    with socket.create_server(("127.0.0.1", 0), backlog=1024) as silent_server:
        port = silent_server.getsockname()[1]  # accepts connections, never sends a byte
        hung = [
            sqlqueue.JobRequest(job_type=job_type, payload=payload, max_attempts=2)
            for _ in range(faults.size)
            for job_type, payload in (
                ("fault.hang_async", {}),
                ("fault.hang_socket", {"port": port}),
                ("fault.spin", {}),
            )
        ]
        healthy = [
            sqlqueue.JobRequest(
                job_type="fault.sleep", payload={"seconds": 0.1}, priority=n % 2
            )  # half alongside the hung jobs, half after them
            for n in range(60 * faults.size)
        ]
        env = {"FAULT_TIMEOUT_SECONDS": str(TIMEOUT)}
        faults.start_many(1, concurrency=CONCURRENCY, env=env)
        ids = faults.enqueue_requests(hung + healthy)
        hung_ids, healthy_ids = ids[: len(hung)], ids[len(hung) :]
        faults.wait_for(len(hung), "dead", timeout=60 + 10 * faults.size)
        faults.wait_for(len(hung) + len(healthy), "dead", "succeeded", timeout=60)
        # Every slot serves again, while the abandoned socket reads still block their threads
        # (the silent server holds their connections open): one gated job per slot, all
        # started at once, none able to end before the test opens their gate.
        gate = faults.tmp_path / "slots"
        slot_ids = faults.enqueue("fault.gated", [{"gate": str(gate)}] * CONCURRENCY)
        poll(
            lambda: set(slot_ids) <= {e.job_id for e in faults.ledger()},
            timeout=60,
            what=f"{CONCURRENCY} gated jobs to run at once",
        )
        gate.with_suffix(".1").touch()
        faults.wait_for(len(hung) + len(healthy) + CONCURRENCY, "dead", "succeeded", timeout=60)
        faults.stop_all()

    rows = faults.jobs()
    executions = faults.ledger()
    lengths = []
    for job_id in hung_ids:
        job = rows[job_id]
        assert (job.status, job.attempts) == ("dead", 2), job
        assert [e.kind for e in job.errors] == ["JobTimeout", "JobTimeout"], job.errors
        lengths += [float((e.details or {})["elapsed_seconds"]) for e in job.errors]
        assert sum(e.job_id == job_id for e in executions) == 2
    hung_end = max(e.started for e in executions if e.job_id in set(hung_ids)) + TIMEOUT
    later = [
        (e.started, e.finished or e.started)
        for e in executions
        if e.job_id in set(healthy_ids) and e.started > hung_end
    ]
    counted = tally(healthy_ids, executions)
    peak = most_at_once(later)
    faults.figure(
        f"{len(hung)} hung jobs (async wait, socket read, CPU loop) x2 attempts, timeout "
        f"{TIMEOUT:g} s, among {len(healthy)} healthy jobs on {CONCURRENCY} slots: attempt "
        f"length p50 {percentile(lengths, 0.5):.2f} s, max {max(lengths):.2f} s; healthy "
        f"{counted.line()}; healthy jobs at once after the last hang {peak}/{CONCURRENCY}",
        attempt_max=round(max(lengths), 3),
        slots_after=peak,
        lost=len(counted.lost),
    )
    # Never cut short; how long past its timeout an attempt ended is the figure's to say.
    assert all(length >= TIMEOUT for length in lengths), sorted(lengths)
    assert counted.spread == (1, 1)
    assert all(rows[job_id].status == "succeeded" for job_id in healthy_ids)
    assert all(rows[job_id].status == "succeeded" for job_id in slot_ids)
