"""Waiting for an effect: poll an observable condition until it holds or a deadline passes.

The only way the suite waits for something to happen. A blind ``time.sleep`` guesses how long a
busy machine needs; a poll asks, and fails with what it was waiting for (and, with ``explain``,
what it saw instead) when the deadline passes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["DEADLINE_SECONDS", "DeadlineExceeded", "bounded", "wait_until"]

T = TypeVar("T")

#: How long ``drain`` and :func:`bounded` let a call run: far beyond what the few jobs of a
#: test need on a loaded machine, far below pytest's 300 s timeout, so a build that never stops
#: finding work (a callback that enqueues itself again, a bulk action that takes the same rows
#: again) fails with a message saying what was left, instead of hanging until the timeout.
DEADLINE_SECONDS = 60.0


def wait_until(
    probe: Callable[[], T | None],
    timeout: float = 10.0,
    *,
    what: str = "the condition",
    interval: float = 0.02,
    explain: Callable[[], str] | None = None,
) -> T:
    """Call ``probe`` every ``interval`` seconds until it returns something truthy, and return
    that; fail the test after ``timeout`` seconds, naming ``what`` (and ``explain()``)."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            details = f"\n{explain()}" if explain else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{details}")
        time.sleep(interval)


class DeadlineExceeded(AssertionError):
    """A call that :func:`bounded` ran was still running at its deadline."""


def bounded(what: str, call: Callable[[], T], deadline: float = DEADLINE_SECONDS) -> T:
    """``call()``'s result, run in a thread; fail the test (``DeadlineExceeded``, naming
    ``what``) if it has not returned after ``deadline`` seconds, instead of hanging."""
    outcome: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as error:
            outcome.append((False, error))

    thread = threading.Thread(target=run, name=f"bounded: {what}", daemon=True)
    thread.start()
    thread.join(deadline)
    if not outcome:
        raise DeadlineExceeded(f"{what} was still running after {deadline:.0f} s")
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]
