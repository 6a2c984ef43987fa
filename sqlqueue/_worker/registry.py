"""A worker's row in the live workers' table (``sqlqueue_workers``): written by every heartbeat,
in the transaction that extends the worker's leases (one statement more in a round trip the
worker makes anyway, never per job), deleted when it stops cleanly. Missing three heartbeats, it
counts as gone; retention prunes it later. It says which queues the worker serves and which job
types it has tasks for: what ``health`` needs to tell jobs no live worker can run."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlqueue._store.admin import Admin

__all__ = ["MISSED_BEATS", "Registration"]

#: Heartbeat intervals a worker may miss before it counts as gone.
MISSED_BEATS = 3


def _version() -> str:
    try:
        return metadata.version("sqlalchemy-sqlqueue")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown"


class Registration:
    """One worker's row: its columns for the heartbeat (:meth:`row`), :meth:`announce` once
    more when it begins to stop, :meth:`withdraw` at a clean exit."""

    def __init__(
        self,
        admin: Admin,
        *,
        worker_id: str,
        queues: Mapping[str, int],
        job_types: Sequence[str] | None,
        interval: float,
    ) -> None:
        self._admin = admin
        self.worker_id = worker_id
        self.interval = interval
        self._facts: dict[str, Any] = {
            "host": socket.gethostname()[:255],
            "pid": os.getpid(),
            "version": _version()[:50],
            "queues": dict(queues),
            "job_types": None if job_types is None else sorted(job_types),
        }

    @property
    def expires_in(self) -> float:
        """How long a written row counts as live: :data:`MISSED_BEATS` intervals."""
        return MISSED_BEATS * self.interval

    def row(self, *, running: int, stopping: bool) -> dict[str, Any]:
        """The row's columns other than its times, as the heartbeat writes them."""
        return {**self._facts, "running": running, "stopping": stopping}

    def announce(self, *, running: int, stopping: bool) -> None:
        """Write the row in a transaction of its own (live for :data:`MISSED_BEATS` intervals
        from now): the heartbeat writes it otherwise."""
        self._admin.announce_worker(
            worker_id=self.worker_id,
            facts=self.row(running=running, stopping=stopping),
            expires_in=self.expires_in,
        )

    def withdraw(self) -> None:
        """Delete the row: this worker stopped."""
        self._admin.remove_worker(worker_id=self.worker_id)
