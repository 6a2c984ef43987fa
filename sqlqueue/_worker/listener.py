"""Wake-ups: a thread that listens for "new job in queue X" and wakes the claim loop at once.

On PostgreSQL each enqueue sends ``NOTIFY sqlqueue, '<queue>'`` as part of its INSERT (no extra
round trip; ``sqlqueue.<schema>`` for tables in a named schema); the notification arrives when
the enqueuing transaction commits. It is only a
hint: workers keep polling at ``poll_interval``, so a lost notification, a broken listening
connection or a pooler that drops LISTEN (PgBouncer in transaction mode) only costs latency.
The listener reconnects by itself.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy import Engine

from sqlqueue.dialects import Dialect

__all__ = ["Listener"]

log = logging.getLogger("sqlqueue.worker")


class Listener:
    """Listens on the dialect's wake channel (its schema's) in a daemon thread and calls
    ``on_wake(queue)``."""

    def __init__(self, engine: Engine, dialect: Dialect, on_wake: Callable[[str], object]) -> None:
        self._engine = engine
        self._dialect = dialect
        self._on_wake = on_wake
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqlqueue-listener", daemon=True)
        self.connected = threading.Event()

    def start(self) -> None:
        """Start listening (a no-op for backends without wake-ups)."""
        if self._dialect.supports_listen_notify:
            self._thread.start()

    def stop(self) -> None:
        """Stop listening within about a second."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        failures = 0
        while not self._stopped.is_set():
            try:
                with self._dialect.listen(self._engine, self._dialect.wake_channel) as wait:
                    self.connected.set()
                    if failures:
                        log.info("wake-up listener reconnected")
                    failures = 0
                    while not self._stopped.is_set():
                        for queue in wait(1.0):
                            self._on_wake(queue)
            except Exception as error:  # any driver error: fall back to polling, then retry
                self.connected.clear()
                failures += 1
                delay = min(30.0, 0.5 * 2 ** min(failures - 1, 6))
                log.warning(
                    "wake-up listener lost its connection (%s); polling until it reconnects "
                    "in %.1f s",
                    " ".join(str(error).split()) or type(error).__name__,
                    delay,
                )
                self._stopped.wait(delay)
