"""9. One idempotency key, 50 concurrent enqueuers (7 processes x 7 threads, plus one holder),
30 % rolled back, one holding its transaction a second before rolling back -> exactly one job
per key, every committed caller gets its id, no IntegrityError (or any error) reaches a caller.

Extends ``tests/test_idempotency_processes.py`` (20 single-connection processes) to 50
connections; the soak repeats the race for 20 keys.
"""

from __future__ import annotations

import json
import queue as queue_module
import random
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import sqlalchemy as sa

from tests.apps.processes import REPO_ROOT, child_env
from tests.faults._harness import Faults

pytestmark = pytest.mark.timeout(900)

PROCESSES = 7
THREADS = 7
HOLD = 1.0
ROLLED_BACK = 15  # of 50, the holder included


class Enqueuers:
    """One ``tests.apps.fault_enqueuers`` process, driven over stdin/stdout."""

    def __init__(self, url: str, threads: int, log_path: Path) -> None:
        self._log: IO[bytes] = log_path.open("wb")
        self.log_path = log_path
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "tests.apps.fault_enqueuers", str(threads)],
            cwd=REPO_ROOT,
            env=child_env(url),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self._events: queue_module.Queue[dict[str, Any] | None] = queue_module.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self._events.put(json.loads(line))
        self._events.put(None)

    def event(self, name: str, timeout: float = 60.0) -> dict[str, Any]:
        """The next event called ``name``."""
        while True:
            try:
                event = self._events.get(timeout=timeout)
            except queue_module.Empty:
                raise AssertionError(f"no {name!r} within {timeout:g} s") from None
            if event is None:
                stderr = self.log_path.read_text(errors="replace")[-3000:]
                raise AssertionError(f"the enqueuers exited early:\n{stderr}")
            if event["event"] == name:
                return event

    def send(self, key: str, plan: list[dict[str, Any]]) -> None:
        """Start a round."""
        assert self.popen.stdin is not None
        self.popen.stdin.write(json.dumps({"key": key, "plan": plan}) + "\n")
        self.popen.stdin.flush()

    def close(self) -> None:
        """End the process."""
        if self.popen.stdin is not None:
            self.popen.stdin.close()
        try:
            self.popen.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        self._log.close()


@pytest.fixture
def crowd(faults: Faults, tmp_path: Path) -> Iterator[tuple[Enqueuers, list[Enqueuers]]]:
    """One holder process of one thread and seven processes of seven threads."""
    url = faults.backend.url
    holder = Enqueuers(url, 1, tmp_path / "holder.log")
    others = [Enqueuers(url, THREADS, tmp_path / f"crowd-{n}.log") for n in range(PROCESSES)]
    try:
        for process in (holder, *others):
            process.event("ready")
        yield holder, others
    finally:
        for process in (holder, *others):
            process.close()


def test_fifty_enqueuers_racing_on_one_key_leave_one_job(
    faults: Faults, crowd: tuple[Enqueuers, list[Enqueuers]]
) -> None:
    holder, others = crowd
    waited, errors = [], []
    for round_number in range(faults.size):
        key = f"race:{round_number}"
        modes = ["rollback"] * (ROLLED_BACK - 1) + ["commit"] * (PROCESSES * THREADS - 14)
        random.shuffle(modes)
        holder.send(key, [{"mode": "rollback", "hold": HOLD}])
        holder.event("enqueued")  # its row is written, not committed: the key is held
        for index, process in enumerate(others):
            process.send(key, [{"mode": m} for m in modes[index * THREADS : (index + 1) * THREADS]])
        results = [r for process in others for r in process.event("round")["results"]]
        (held,) = holder.event("round")["results"]
        errors += [r["error"] for r in [*results, held] if "error" in r]

        query = sa.text("SELECT id FROM sqlqueue_jobs WHERE idempotency_key = :key")
        with faults.engine.connect() as conn:
            stored = list(conn.execute(query, {"key": key}).scalars())
        assert len(stored) == 1, f"round {round_number}: {stored}"
        committed = {r.get("id") for r in results if r["mode"] == "commit"}
        assert committed == set(stored), "every committed caller got the surviving job's id"
        waited += [r["enqueued"] - held["ending"] for r in results if "enqueued" in r]

    with faults.engine.connect() as conn:
        total = conn.execute(sa.text("SELECT count(*) FROM sqlqueue_jobs")).scalar_one()
    faults.figure(
        f"{faults.size} key(s) x 50 enqueuers ({PROCESSES} processes x {THREADS} threads + 1 "
        f"holder, {ROLLED_BACK} rolled back, the holder after {HOLD:g} s): jobs per key 1, "
        f"errors {len(errors)}; every contender waited for the holder (earliest enqueue "
        f"{min(waited) * 1000:+.0f} ms after its rollback)",
        errors=len(errors),
        jobs=total,
    )
    assert not errors, errors[:5]
    assert total == faults.size
    assert min(waited) > 0, "nobody saw the held row before the holder ended"
