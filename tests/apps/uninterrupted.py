"""Bookkeeping that a task's timeout cannot cut short.

A sync handler that runs past its timeout is interrupted by a ``JobTimeout`` raised in its
thread at the next bytecode it runs. When the handler was still writing its ledger row (on a
loaded machine a write can take longer than a 0.5 s timeout), the interrupt landed inside the
write, which rolled back: the attempt ran, and its row was missing. :func:`uninterrupted` runs
the write on a thread of its own and waits for it; a thread blocked in ``join`` runs no
bytecode, so the interrupt lands once the write has returned, never inside it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["uninterrupted"]

T = TypeVar("T")


def uninterrupted(call: Callable[[], T]) -> T:
    """``call()``, run to its end on another thread whatever interrupts this one meanwhile;
    its result, or its exception, comes back here."""
    results: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(call())
        except BaseException as error:  # handed back to the caller
            errors.append(error)

    thread = threading.Thread(target=run, name="uninterrupted")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]
