"""A batch's callback: the checked job request its row stores, and the job inserted from it
when the batch finishes (``on_dead`` if a child ended dead and there is one)."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from sqlqueue._jobrow import JobRow
from sqlqueue._store.inserts import insert_rows
from sqlqueue.dialects import Dialect

__all__ = ["enqueue_callback", "request_document"]


def request_document(row: JobRow | None) -> dict[str, Any] | None:
    """A checked callback job as its batch stores it (the payload stays encoded, as checked)."""
    if row is None:
        return None
    run_at = row["_run_at"]
    return {
        "job_type": row["job_type"],
        "queue": row["queue"],
        "priority": row["priority"],
        "payload": row["payload"],
        "max_attempts": row["max_attempts"],
        "group_key": row["group_key"],
        "limit_key": row["limit_key"],
        "trace_context": row["trace_context"],
        "run_at": run_at.isoformat() if run_at is not None else None,
        "delay": row["_delay"],
    }


def _request_row(document: Mapping[str, Any], batch_id: int) -> JobRow:
    """The callback job to insert for ``batch_id`` from its stored document."""
    run_at = document.get("run_at")
    return {
        "job_type": str(document["job_type"]),
        "queue": str(document["queue"]),
        "priority": int(document["priority"]),
        "payload": str(document["payload"]),
        "max_attempts": int(document["max_attempts"]),
        "idempotency_key": None,
        "group_key": document.get("group_key"),
        # The callback joins the trace of the code that started the batch.
        "trace_context": document.get("trace_context"),
        "batch_id": batch_id,
        "limit_key": document.get("limit_key"),
        "unique_key": None,
        "expires_at": None,
        "_run_at": datetime.fromisoformat(run_at) if run_at else None,
        "_delay": float(document.get("delay") or 0.0),
    }


def enqueue_callback(
    conn: Connection,
    dialect: Dialect,
    batch_id: int,
    *,
    dead: int,
    on_complete: Mapping[str, Any] | None,
    on_dead: Mapping[str, Any] | None,
) -> tuple[int, str] | None:
    """Insert the callback of finishing batch ``batch_id`` (``on_dead`` if a child ended dead
    and there is one); its id and queue, or ``None`` without a callback."""
    request = on_dead if dead and on_dead is not None else on_complete
    if request is None:
        return None
    row = _request_row(request, batch_id)
    return insert_rows(dialect, conn, [row])[0], row["queue"]
