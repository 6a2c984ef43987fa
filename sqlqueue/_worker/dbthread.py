"""One thread for a worker's database calls, so SQL never blocks the event loop.

A single thread keeps a worker at one pooled connection and serialises its statements; the
statements are batched (claims, completions, heartbeats), so one thread is not the bottleneck.
Every call that returns counts as an answer of the database (:class:`Answers`), which tells
the duties' retries a passing fault from an outage (see sqlqueue/_worker/retries.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sqlqueue._logs import current_worker
from sqlqueue._worker.retries import Answers

__all__ = ["DatabaseThread"]

T = TypeVar("T")


class DatabaseThread:
    """Runs blocking store calls off the event loop, one at a time."""

    def __init__(self, worker_id: str | None = None) -> None:
        self._pool = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="sqlqueue-db",
            initializer=current_worker.set,  # the records logged there carry the worker's id
            initargs=(worker_id,),
        )
        #: When the database last answered a call of this thread.
        self.answers = Answers()

    async def call(self, operation: Callable[[], T]) -> T:
        """Run ``operation`` on the database thread and await its result."""
        result = await asyncio.get_running_loop().run_in_executor(self._pool, operation)
        self.answers.answered()
        return result

    def close(self) -> None:
        """Finish queued calls and stop the thread."""
        self._pool.shutdown(wait=True)
