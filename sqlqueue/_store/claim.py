"""The claim: lease due jobs to a worker in one statement and read them as claimed jobs."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection

from sqlqueue._store.claim_floor import ClaimFloors, FloorKey
from sqlqueue._store.rows import ClaimedJob, claims_from_rows
from sqlqueue._store.statement_cache import cached_statement
from sqlqueue.dialects import Dialect

__all__ = ["claim", "loads_document"]


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
    floors: ClaimFloors | None = None,
    limited: tuple[str, str] | None = None,
) -> list[ClaimedJob]:
    """Lease up to ``limit`` due jobs to ``worker_id``, most urgent first.

    With ``floors`` (on a dialect that ``supports_claim_floor``, on the database's own clock)
    the claim starts past the jobs this worker claimed before (see ``claim_floor.py``). Jobs
    claimed ``ahead`` of a free slot are leased with no ``started_at`` until their start is
    recorded (:func:`~sqlqueue._store.outcomes.record_starts`). ``limited`` (a task and a
    limit key): only that key's jobs, for a caller that holds the key's lock and counted its
    room (``limited_claim.py``); otherwise only jobs with no limit key."""
    params: dict[str, Any] = {
        "claim_limit": limit,
        "worker_id": worker_id,
        "lease_seconds": float(lease_seconds),
        "claim_ahead": ahead,
    }
    if limited is not None:
        params.update(claim_limit_job_type=limited[0], claim_limit_key=limited[1])
        floors = None
    with_floor = floors is not None and dialect.supports_claim_floor and now is None
    queue_key = tuple(queues), None if job_types is None else tuple(job_types)
    floor_key = FloorKey(worker_id=worker_id, queues=queue_key[0], job_types=queue_key[1])
    floor = None
    if with_floor:
        assert floors is not None
        floor = floors.floor_for(floor_key)
    if floor is not None:
        params.update(floor_priority=floor.priority, floor_due=floor.due)
    if now is None:
        key = ("claim", type(dialect), *queue_key, floor is not None, limited is not None)
        stmt = cached_statement(
            key,
            lambda: dialect.claim_statement(
                queues=queues,
                job_types=job_types,
                lease_seconds=lease_seconds,
                now=None,
                floor=floor is not None,
                limited=limited is not None,
            ),
        )
    else:
        stmt = dialect.claim_statement(
            queues=queues,
            job_types=job_types,
            lease_seconds=lease_seconds,
            now=now,
            limited=limited is not None,
        )
    claimed = claims_from_rows(
        dialect.execute_returning(conn, stmt, params).all(),
        moment=dialect.claim_moment,
        document=_json_decoder(conn),
    )
    if with_floor:
        assert floors is not None
        floors.observe(floor_key, claimed, bounded=floor is not None)
    claimed.sort(key=lambda job: (job.priority, job.id))
    return claimed


def _json_decoder(conn: Connection) -> Callable[[str], Any]:
    """The engine's ``create_engine(json_deserializer=…)``, which the JSON column type would
    have used for a claim's payload, else :func:`loads_document`."""
    return getattr(conn.dialect, "_json_deserializer", None) or loads_document


#: The default decoder's scanner, as ``json.loads`` uses it (typeshed does not list it).
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def loads_document(text: str) -> Any:
    """``json.loads(text)``, at a quarter of its cost for a document as the database writes
    it back: one JSON value, no space around it, read by ``json``'s own C scanner without
    the two Python calls around it (0.6 µs per claimed job). Anything else — space around
    the value, text after it, no value at all — goes to ``json.loads``, which decides."""
    try:
        value, end = _scan(text, 0)
    except StopIteration:
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value
