"""The thread pool that runs synchronous handlers.

Unlike ``concurrent.futures.ThreadPoolExecutor`` a thread can be *abandoned*: when a handler
runs past its timeout the pool starts a replacement thread at once (the pool never runs short),
asks the stuck thread to stop by raising :class:`JobTimeout` inside it (this interrupts Python
code such as a CPU loop, not a blocking C call), and lets it exit when its call returns. The
abandoner gets a future that resolves at that return: a timed-out job keeps its slot (and its
concurrency limit's) until then, as the handler is still running.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from sqlqueue._errors import JobTimeout
from sqlqueue._logs import current_worker

__all__ = ["HandlerThreads", "Ticket"]

log = logging.getLogger("sqlqueue.worker")


class Ticket:
    """One call submitted to the pool; lets the submitter abandon it."""

    def __init__(self, call: Callable[[], Any], future: asyncio.Future[Any]) -> None:
        self.call = call
        self.future = future
        self.lock = threading.Lock()
        self.thread_id: int | None = None
        self.running = False
        self.abandoned = False
        #: Set when the call was abandoned while running: resolves when the call returns.
        self.returned: asyncio.Future[None] | None = None


class HandlerThreads:
    """A fixed number of live threads for sync handlers, with replacement of stuck ones."""

    def __init__(
        self, size: int, *, name: str = "sqlqueue-handler", worker_id: str | None = None
    ) -> None:
        self._size = size
        self._name = name
        #: Current in every thread of the pool, for the records logged there.
        self._worker_id = worker_id
        self._inbox: queue.SimpleQueue[Ticket | None] = queue.SimpleQueue()
        self._count = 0
        self._count_lock = threading.Lock()
        # Finished calls wait here for the event loop, which settles them all in one callback:
        # one wake-up of the loop per burst of completions rather than one per call.
        self._finished: collections.deque[tuple[asyncio.Future[Any], tuple[bool, Any]]] = (
            collections.deque()
        )
        self._settle_scheduled = False
        self._settle_lock = threading.Lock()
        for _ in range(size):
            self._spawn()

    def _spawn(self) -> None:
        with self._count_lock:
            self._count += 1
            number = self._count
        thread = threading.Thread(target=self._serve, name=f"{self._name}-{number}", daemon=True)
        thread.start()

    def submit(self, call: Callable[[], Any]) -> Ticket:
        """Queue ``call``; its result or exception arrives on ``ticket.future``."""
        loop = asyncio.get_running_loop()
        ticket = Ticket(call, loop.create_future())
        self._inbox.put(ticket)
        return ticket

    def abandon(self, ticket: Ticket) -> asyncio.Future[None] | None:
        """Give up on ``ticket``: replace its thread and interrupt the call if it is running.
        Return a future that resolves when that call has really returned (``None`` if it was
        not running): until then the handler still runs, and still counts against limits."""
        with ticket.lock:
            if ticket.abandoned:
                return ticket.returned
            ticket.abandoned = True
            # Nobody awaits this future any more: cancel it so the interrupted call's late
            # JobTimeout is not logged by asyncio as "Future exception was never retrieved".
            ticket.future.cancel()
            if ticket.running and ticket.thread_id is not None:
                ticket.returned = ticket.future.get_loop().create_future()
                _raise_in_thread(ticket.thread_id, JobTimeout)
                self._spawn()
            return ticket.returned

    def shutdown(self) -> None:
        """Let idle threads exit; stuck ones are daemons and do not hold the process."""
        for _ in range(self._size):
            self._inbox.put(None)

    def _serve(self) -> None:
        current_worker.set(self._worker_id)  # this thread's own context, for its lifetime
        while True:
            ticket = self._inbox.get()
            if ticket is None:
                return
            try:
                if not self._run(ticket):
                    return
            except JobTimeout:
                # A late interrupt aimed at a call that already returned: this thread was
                # replaced when it was abandoned, so it simply ends.
                return

    def _run(self, ticket: Ticket) -> bool:
        """Run one ticket; return whether this thread should keep serving."""
        with ticket.lock:
            if ticket.abandoned:
                return True
            ticket.thread_id = threading.get_ident()
            ticket.running = True
        outcome: tuple[bool, Any]
        try:
            outcome = (True, ticket.call())
        except BaseException as error:  # handed to the event loop, which classifies it
            outcome = (False, error)
        with ticket.lock:
            ticket.running = False
            abandoned = ticket.abandoned
            returned = ticket.returned
        if returned is not None:
            try:
                returned.get_loop().call_soon_threadsafe(_resolve, returned)
            except RuntimeError:
                log.debug("event loop closed before an abandoned handler thread returned")
        self._finished.append((ticket.future, outcome))
        with self._settle_lock:
            schedule = not self._settle_scheduled
            self._settle_scheduled = True
        if schedule:
            try:
                ticket.future.get_loop().call_soon_threadsafe(self._settle_finished)
            except RuntimeError:
                log.debug("event loop closed before a handler thread finished")
        return not abandoned

    def _settle_finished(self) -> None:
        """On the event loop: hand every finished call's outcome to its future."""
        with self._settle_lock:
            self._settle_scheduled = False
        while self._finished:
            future, (ok, value) = self._finished.popleft()
            if future.done():  # abandoned (cancelled) meanwhile: nobody waits for it
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)


def _resolve(future: asyncio.Future[None]) -> None:
    """On the event loop: an abandoned call has returned."""
    if not future.done():
        future.set_result(None)


def _raise_in_thread(thread_id: int, exception: type[BaseException]) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exception)
    )
