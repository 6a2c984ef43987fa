"""One thread for a worker's database calls, so SQL never blocks the event loop.

A single thread keeps a worker at one pooled connection and serialises its statements; the
statements are batched (claims, completions, heartbeats), so one thread is not the bottleneck.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sqlqueue._logs import current_worker

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

    async def call(self, operation: Callable[[], T]) -> T:
        """Run ``operation`` on the database thread and await its result."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, operation)

    def close(self) -> None:
        """Finish queued calls and stop the thread."""
        self._pool.shutdown(wait=True)
