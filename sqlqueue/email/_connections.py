"""Reusing SMTP connections between messages: the idle, connected clients a worker's event loop
keeps for its next message (``SMTP(pool_size=…)``).

A client is only kept after a message the server accepted, and only while it is connected;
the next message checks it with NOOP before using it (a server closes idle connections, often
after a minute or less), so a stale connection costs a round trip and a fresh connect, never an
attempt. An idle client nobody takes within ``idle_seconds`` is closed. Clients belong to the
event loop they were opened on, so each loop (one per running worker) has its own; those still
idle when their worker stops are left to the process's exit (or the garbage collector) to close,
as there is no hook at a worker's end to close them from.
"""

from __future__ import annotations

import asyncio
import time
import weakref

import aiosmtplib

__all__ = ["ConnectionPool"]


class ConnectionPool:
    """Up to ``size`` idle, connected clients per event loop, each kept ``idle_seconds`` at most."""

    def __init__(self, *, size: int, idle_seconds: float) -> None:
        self.size = size
        self.idle_seconds = idle_seconds
        self._idle: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, list[tuple[float, aiosmtplib.SMTP]]
        ] = weakref.WeakKeyDictionary()

    def take(self) -> aiosmtplib.SMTP | None:
        """The most recently used idle client of this loop that is still connected, or ``None``."""
        idle = self._idle.get(asyncio.get_running_loop())
        now = time.monotonic()
        while idle:
            since, client = idle.pop()
            if client.is_connected and now - since < self.idle_seconds:
                return client
            client.close()
        return None

    def give_back(self, client: aiosmtplib.SMTP) -> bool:
        """Keep ``client`` for the next message if there is room; ``False`` if it was not kept
        (the caller says goodbye to it)."""
        loop = asyncio.get_running_loop()
        if loop not in self._idle:
            self._forget_closed_loops()
        idle = self._idle.setdefault(loop, [])
        if not client.is_connected or len(idle) >= self.size:
            return False
        entry = (time.monotonic(), client)
        idle.append(entry)
        loop.call_later(self.idle_seconds, self._expire, idle, entry)
        return True

    def _forget_closed_loops(self) -> None:
        """Drop the clients of loops that have ended (a worker that stopped): they cannot be
        used or closed from another loop, and they keep their loop alive. The garbage collector
        then closes their sockets."""
        for loop in [loop for loop in self._idle if loop.is_closed()]:
            del self._idle[loop]

    @staticmethod
    def _expire(
        idle: list[tuple[float, aiosmtplib.SMTP]], entry: tuple[float, aiosmtplib.SMTP]
    ) -> None:
        """Close a client still idle since ``entry`` was made (it was not taken meanwhile)."""
        for index, kept in enumerate(idle):
            if kept is entry:
                del idle[index]
                entry[1].close()
                return
