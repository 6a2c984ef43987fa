"""Waiting for an effect: poll an observable condition until it holds or a deadline passes.

The only way the suite waits for something to happen. A blind ``time.sleep`` guesses how long a
busy machine needs; a poll asks, and fails with what it was waiting for (and, with ``explain``,
what it saw instead) when the deadline passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["wait_until"]

T = TypeVar("T")


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
