"""5. Several processes on one SQLite file: each enqueues, claims and completes, while a
reader keeps a transaction open all along and a writer is SIGKILLed holding the write lock.

-> no "database is locked" reaches a caller or a log, lost = duplicates = 0, the killed
writer's rows never appear, ``PRAGMA integrity_check`` says ok.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.apps.processes import REPO_ROOT, child_env
from tests.faults._harness import Faults, history_problems, tally

# Many worker processes at once: under pytest-xdist these modules share one group, so
# two of them never run at the same time on a 2-core machine (see docs/development.md).
pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("many_processes")]

PER_PROCESS = 50
#: How long the doomed writer holds the write lock before its SIGKILL.
HOLD = 0.5


@pytest.mark.parametrize("processes", [4, 8])
def test_processes_sharing_one_sqlite_file(
    sqlite_faults: Faults, tmp_path: Path, processes: int
) -> None:
    faults = sqlite_faults
    per_process = PER_PROCESS * faults.size
    total = processes * per_process
    database = sa.make_url(faults.backend.url).database
    assert database is not None
    go = tmp_path / "go"
    env = {"FAULT_ENQUEUE_JOBS": str(per_process), "FAULT_ENQUEUE_START_FILE": str(go)}
    pool = faults.start_many(processes, concurrency=4, env=env)

    reader = sqlite3.connect(database, isolation_level=None)
    reader.execute("BEGIN")
    snapshot = reader.execute("SELECT count(*) FROM sqlqueue_jobs").fetchone()[0]
    reader_opened = time.monotonic()
    go.touch()
    began = time.monotonic()
    try:
        faults.wait_for(total // 10, "queued", "running", "succeeded", timeout=60)
        writer = subprocess.Popen(
            [sys.executable, "-m", "tests.apps.fault_writer", "5"],
            cwd=REPO_ROOT,
            env=child_env(faults.backend.url),
            stdout=subprocess.PIPE,
            text=True,
        )
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "holding"
        time.sleep(HOLD)  # every other writer waits for the lock meanwhile
        writer.send_signal(signal.SIGKILL)
        assert writer.wait(10) == -signal.SIGKILL
        writer.stdout.close()
        faults.wait_for(total, "succeeded", timeout=120 + total / 10)
        took = time.monotonic() - began
        still = reader.execute("SELECT count(*) FROM sqlqueue_jobs").fetchone()[0]
        held = time.monotonic() - reader_opened
    finally:
        reader.rollback()
        reader.close()
    wal = Path(f"{database}-wal")
    wal_bytes = wal.stat().st_size if wal.exists() else 0
    faults.stop_all()

    logs = {worker.pid: worker.log() for worker in pool}
    surfaced = [
        (pid, line)
        for pid, log in logs.items()
        for line in log.splitlines()
        if "locked" in line.lower() or "busy" in line.lower() or "traceback" in line.lower()
    ]
    enqueued = sum(f"fault enqueuer: committed {per_process} jobs" in log for log in logs.values())
    jobs = faults.jobs()
    counted = tally(jobs, faults.ledger())
    with sqlite3.connect(database) as check:
        integrity = check.execute("PRAGMA integrity_check").fetchall()
    doomed = [job.id for job in jobs.values() if (job.idempotency_key or "").startswith("doomed")]
    faults.figure(
        f"{processes} processes each enqueuing {per_process} jobs (1-5 per transaction) and "
        f"working them, a reader holding one transaction {held:.1f} s, a writer SIGKILLed "
        f"holding the write lock {HOLD:g} s: {counted.line()}; 'locked'/'busy' in logs "
        f"{len(surfaced)}; killed writer's rows {len(doomed)}; integrity {integrity[0][0]}; "
        f"WAL {wal_bytes / 1e6:.1f} MB; {total / took:,.0f} jobs/s enqueued and worked",
        lost=len(counted.lost),
        duplicates=len(counted.duplicates),
        locked_errors=len(surfaced),
    )
    assert not surfaced, surfaced[:5]
    assert enqueued == processes, "every enqueuer committed all its jobs without an error"
    assert len(jobs) == total
    assert not doomed
    assert still == snapshot, "the long reader kept its snapshot throughout"
    assert not counted.lost
    assert not counted.duplicates, faults.describe_jobs(counted.duplicates)
    assert integrity == [("ok",)]
    assert not history_problems(faults.transitions())
    assert os.path.exists(database)
