"""What :meth:`sqlqueue.Queue.workers` returns: one worker process as its row in the live
workers' table says, read by operators (CLI, web page) without asking the worker anything."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["WorkerInfo"]


@dataclass(frozen=True, kw_only=True)
class WorkerInfo:
    """One worker process: ``id`` (what a running job's ``locked_by`` holds), the ``host`` and
    ``pid`` it runs as, its sqlqueue ``version``, the ``queues`` it serves with each one's
    concurrency, when it started and last wrote its row (``last_seen_at``, database clock), how
    many jobs it was running then, whether it was shutting down (``stopping``), and whether it is
    ``alive``: its last heartbeat is less than three heartbeat intervals old. A worker that stops
    cleanly deletes its row; one that is killed stays, no longer alive, until it is pruned."""

    id: str
    host: str
    pid: int
    version: str
    queues: dict[str, int]
    started_at: datetime
    last_seen_at: datetime
    running: int
    stopping: bool
    alive: bool

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (``sqlqueue workers --json`` prints a list of these)."""
        return {
            "id": self.id,
            "host": self.host,
            "pid": self.pid,
            "version": self.version,
            "queues": dict(self.queues),
            "started_at": self.started_at.isoformat(),
            "last_seen_at": self.last_seen_at.isoformat(),
            "running": self.running,
            "stopping": self.stopping,
            "alive": self.alive,
        }
