"""The tasks the fault tests run: each execution appends a row to the fault ledger.

Every handler learns its job id and attempt from its :class:`sqlqueue.JobContext` and writes
the ledger through its own engine (:func:`ledger_engine`), autocommitted, before and after its
work. Registered by the worker processes' app (``fault_app``) and by the tests (to enqueue).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path
from typing import Any

import sqlqueue
from tests.apps.fault_ledger import record_finish, record_start
from tests.apps.uninterrupted import uninterrupted

__all__ = ["KILL_BEFORE_COMMIT", "register_fault_tasks"]

#: Jobs whose completion commit the kill-before-commit hook should sabotage (once each).
KILL_BEFORE_COMMIT: set[int] = set()


def _nap(seconds: float, step: float) -> None:
    """Sleep ``seconds`` of this process's *running* time, in steps: a SIGSTOPped worker
    resumes the rest after SIGCONT, and a timeout's interrupt lands between steps."""
    for _ in range(max(0, round(seconds / step))):
        time.sleep(step)


def register_fault_tasks(queue: sqlqueue.Queue, *, timeout: float = 0.5) -> None:
    """Register the ``fault.*`` tasks on ``queue``; ``timeout`` limits the hanging ones."""
    at_once = sqlqueue.schedule([0])

    @queue.task("fault.noop", backoff=at_once)
    def noop(ctx: sqlqueue.JobContext, kill_commit: bool = False) -> None:
        """One ledger row, started and finished at once."""
        if kill_commit:
            KILL_BEFORE_COMMIT.add(ctx.job_id)
        record_start(ctx.job_id, ctx.attempt, finished=True)

    @queue.task("fault.sleep", backoff=at_once)
    def sleep(
        ctx: sqlqueue.JobContext,
        seconds: float,
        first_seconds: float | None = None,
        step: float = 0.05,
    ) -> dict[str, Any]:
        """Work ``seconds`` (``first_seconds`` on attempt 1); the result names the attempt."""
        ledger_id = record_start(ctx.job_id, ctx.attempt)
        _nap(first_seconds if ctx.attempt == 1 and first_seconds is not None else seconds, step)
        record_finish(ledger_id)
        return {"attempt": ctx.attempt, "pid": os.getpid()}

    @queue.task("fault.gated", backoff=at_once)
    def gated(ctx: sqlqueue.JobContext, gate: str, step: float = 0.02) -> dict[str, Any]:
        """Work until the file ``<gate>.<attempt>`` exists (at most five minutes), so the test
        decides when each attempt ends, whatever the machine's speed; the result names the
        attempt and the process."""
        ledger_id = record_start(ctx.job_id, ctx.attempt)
        opened = Path(f"{gate}.{ctx.attempt}")
        for _ in range(round(300 / step)):  # running time: a SIGSTOPped worker resumes it
            if opened.exists():
                break
            time.sleep(step)
        else:
            raise TimeoutError(f"{opened} was never created")
        record_finish(ledger_id)
        return {"attempt": ctx.attempt, "pid": os.getpid()}

    @queue.task("fault.hang_async", timeout=timeout, backoff=at_once)
    async def hang_async(ctx: sqlqueue.JobContext) -> None:
        """Awaits something that never happens."""
        await asyncio.to_thread(record_start, ctx.job_id, ctx.attempt)
        await asyncio.Event().wait()

    @queue.task("fault.hang_socket", timeout=timeout, backoff=at_once)
    def hang_socket(ctx: sqlqueue.JobContext, port: int) -> None:
        """Blocked in a socket read (a C call no interrupt reaches): the peer never sends."""
        uninterrupted(lambda: record_start(ctx.job_id, ctx.attempt))  # whole, past a timeout
        with socket.create_connection(("127.0.0.1", port)) as connection:
            connection.recv(1)

    @queue.task("fault.spin", timeout=timeout, backoff=at_once)
    def spin(ctx: sqlqueue.JobContext) -> None:
        """A CPU loop that never ends by itself."""
        uninterrupted(lambda: record_start(ctx.job_id, ctx.attempt))  # whole, past a timeout
        counter = 0
        while True:
            counter += 1

    @queue.task("fault.resize", backoff=at_once)
    def resize(ctx: sqlqueue.JobContext, image_id: int, width: int) -> None:
        """Version 2 of a handler whose version 1 took only ``image_id``."""
        record_start(ctx.job_id, ctx.attempt, finished=True)

    _ = (noop, sleep, gated, hang_async, hang_socket, spin, resize)
