"""The claim: lease due jobs to a worker in one statement and read them as claimed jobs."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from sqlqueue._store.rows import ClaimedJob, claims_from_rows
from sqlqueue._store.statement_cache import cached_statement
from sqlqueue.dialects import Dialect

__all__ = ["claim"]


def claim(
    conn: Connection,
    dialect: Dialect,
    *,
    queues: Sequence[str],
    job_types: Sequence[str] | None,
    limit: int,
    worker_id: str,
    lease_seconds: float,
    ahead: bool = False,
    now: datetime | None = None,
) -> list[ClaimedJob]:
    """Lease up to ``limit`` due jobs to ``worker_id``, most urgent first. Jobs claimed
    ``ahead`` of a free slot are leased with no ``started_at`` until their start is recorded
    (:func:`~sqlqueue._store.outcomes.record_starts`)."""
    if now is None:
        key = (
            "claim",
            type(dialect),
            tuple(queues),
            None if job_types is None else tuple(job_types),
        )
        stmt = cached_statement(
            key,
            lambda: dialect.claim_statement(
                queues=queues, job_types=job_types, lease_seconds=lease_seconds, now=None
            ),
        )
    else:
        stmt = dialect.claim_statement(
            queues=queues, job_types=job_types, lease_seconds=lease_seconds, now=now
        )
    params = {
        "claim_limit": limit,
        "worker_id": worker_id,
        "lease_seconds": float(lease_seconds),
        "claim_ahead": ahead,
    }
    claimed = claims_from_rows(
        dialect.execute_returning(conn, stmt, params).all(),
        moment=dialect.claim_moment,
        document=_json_decoder(conn),
    )
    claimed.sort(key=lambda job: (job.priority, job.id))
    return claimed


def _json_decoder(conn: Connection) -> Callable[[str], Any]:
    """The engine's ``create_engine(json_deserializer=…)``, which the JSON column type would
    have used for a claim's payload, else ``json.loads``."""
    return getattr(conn.dialect, "_json_deserializer", None) or json.loads
