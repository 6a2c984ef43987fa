"""Idempotency under real concurrency: many processes enqueue with one key at the same moment.

Each contender (``tests/apps/idempotent_enqueue.py``) is its own process with its own
connection and transaction; some commit, some roll back, one holds its transaction open until
the test has seen every other contender begin. The unique index, not a check-then-insert, must
leave exactly one job and give every committed caller its id.
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
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(120)

CONTENDERS = 12


class Contender:
    """One ``idempotent_enqueue`` process, driven line by line over its stdin and stdout."""

    def __init__(
        self, backend: Backend, log_dir: Path, *, key: str, mode: str, hold: bool = False
    ) -> None:
        self.mode = mode
        self._stderr_path = log_dir / f"contender-{id(self)}.log"
        self._stderr: IO[bytes] = self._stderr_path.open("wb")
        self.popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.apps.idempotent_enqueue",
                "--key",
                key,
                "--mode",
                mode,
                *(["--hold"] if hold else []),
            ],
            cwd=REPO_ROOT,
            env=child_env(backend.url),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._lines: queue_module.Queue[str | None] = queue_module.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def describe(self) -> str:
        """Exit status and stderr, for assertion messages."""
        stderr = self._stderr_path.read_text(errors="replace")[-3000:]
        return f"contender pid {self.popen.pid} ({self.mode}, exit {self.popen.poll()}):\n{stderr}"

    def next_line(self, timeout: float) -> str:
        """The next line the contender prints; fail if none comes within ``timeout``."""
        try:
            line = self._lines.get(timeout=timeout)
        except queue_module.Empty:
            raise AssertionError(f"no output within {timeout:g} s\n{self.describe()}") from None
        if line is None:
            raise AssertionError(f"the contender exited early\n{self.describe()}")
        return line

    def event(self, name: str, timeout: float) -> dict[str, Any]:
        """The next JSON event called ``name`` (events before it are skipped)."""
        while True:
            event: dict[str, Any] = json.loads(self.next_line(timeout))
            if event["event"] == name:
                return event

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the contender is connected and waiting for ``go``."""
        assert self.next_line(timeout) == "ready", self.describe()

    def go(self) -> None:
        """Start the contender's transaction."""
        self._say("go")

    def end(self) -> None:
        """End a holding contender's transaction (as its mode says)."""
        self._say("end")

    def _say(self, line: str) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write(f"{line}\n")
        self.popen.stdin.flush()

    def finish(self, timeout: float = 60.0) -> dict[str, Any]:
        """The contender's ``done`` event, once it has exited cleanly."""
        done = self.event("done", timeout)
        assert "error" not in done, f"enqueue raised: {done['error']}\n{self.describe()}"
        try:
            status = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"did not exit\n{self.describe()}") from None
        assert status == 0, self.describe()
        return done

    def close(self) -> None:
        """Kill the process if it still runs; close its pipes and log."""
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(timeout=10)
        for stream in (self.popen.stdin, self.popen.stdout):
            if stream is not None:
                stream.close()
        self._stderr.close()


@pytest.fixture
def contenders(backend: Backend, tmp_path: Path) -> Iterator[list[Contender]]:
    """The test's contender processes; any still running at the end are killed."""
    started: list[Contender] = []
    try:
        yield started
    finally:
        for contender in started:
            contender.close()


def jobs_with_key(engine: sa.Engine, key: str) -> list[int]:
    """Ids of the committed jobs with idempotency key ``key``."""
    query = sa.text("SELECT id FROM sqlqueue_jobs WHERE idempotency_key = :key")
    with engine.connect() as conn:
        return list(conn.execute(query, {"key": key}).scalars())


def all_job_ids(engine: sa.Engine) -> list[int]:
    """Ids of every committed job."""
    with engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT id FROM sqlqueue_jobs")).scalars())


def test_twelve_processes_racing_on_one_key_leave_one_job(
    backend: Backend, tmp_path: Path, contenders: list[Contender]
) -> None:
    key = "race:welcome_email:user:1"
    # A third roll back; the first of them holds its transaction open until every contender
    # has begun, then rolls back.
    modes = ["rollback"] * 4 + ["commit"] * (CONTENDERS - 4)
    for index, mode in enumerate(modes):
        contenders.append(Contender(backend, tmp_path, key=key, mode=mode, hold=index == 0))
    holder = contenders[0]
    for contender in contenders:
        contender.wait_ready()

    for contender in random.sample(contenders, len(contenders)):
        contender.go()
    for contender in contenders:
        contender.event("began", timeout=60)
    holder.event("enqueued", timeout=60)  # written, not committed: the key is held
    holder.end()
    results = [contender.finish() for contender in contenders]
    held = results[0]
    began = [result["began_at"] for result in results]
    assert all(at < held["ending_at"] for at in began), "they all started while the holder held"

    stored = jobs_with_key(backend.engine, key)
    assert len(stored) == 1, f"exactly one job row for the key, got {stored}"
    assert all_job_ids(backend.engine) == stored, "and no other row"
    committed = {result["id"] for result in results if result["mode"] == "commit"}
    assert committed == set(stored), "every committed caller got the surviving job's id"


def test_a_key_whose_first_transaction_rolls_back_goes_to_a_later_enqueue(
    backend: Backend, tmp_path: Path, contenders: list[Contender]
) -> None:
    key = "race:first-rolls-back"
    holder = Contender(backend, tmp_path, key=key, mode="rollback", hold=True)
    later = [Contender(backend, tmp_path, key=key, mode="commit") for _ in range(3)]
    contenders.extend([holder, *later])
    for contender in contenders:
        contender.wait_ready()

    holder.go()
    holder.event("enqueued", timeout=30)  # its row is written, not committed: the key is held
    for contender in later:
        contender.go()
    for contender in later:
        contender.event("began", timeout=60)  # each is about to meet the held key
    holder.end()
    held = holder.finish()
    results = [contender.finish() for contender in later]

    stored = jobs_with_key(backend.engine, key)
    assert len(stored) == 1, f"the later enqueue wrote the job, got {stored}"
    assert {result["id"] for result in results} == set(stored)
    for result in results:
        # They waited on the held key and saw the rollback, not a phantom of the held row.
        assert result["enqueued_at"] > held["ending_at"], (result, held)
