"""A worker's floor probe: the look before its claim floors, off the claim path.

A claim with a floor (``claim_floor.py``) skips what sorts before it. The probe finds it: for
each floor, one read from the head of the claim index for the first job a claim without the
floor would take, up to the floor. While a long transaction holds the horizon that read walks
every dead version the claims skip, which is why it is here, on a thread of its own beside
the claims (``sqlqueue/_worker/floor_probe.py`` runs it every ``FLOOR_RESET_SECONDS``), and
not in a claim. When it finds a job, the floor goes down to it and the next claim takes it,
in claim order.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Select

from sqlqueue._store.claim_floor import ClaimFloor, ClaimFloors, FloorKey
from sqlqueue._store.statement_cache import cached_statement
from sqlqueue.dialects import Dialect

__all__ = ["probe_floors"]


def probe_floors(conn: Connection, dialect: Dialect, floors: ClaimFloors) -> int:
    """Look before every floor of ``floors`` and lower those with a claimable job before them;
    how many went down."""
    lowered = 0
    for key, floor in floors.floors():
        started = floors.now()
        row = conn.execute(
            _statement(dialect, key), {"floor_priority": floor.priority, "floor_due": floor.due}
        ).first()
        found = None if row is None else ClaimFloor(priority=row[0], due=row[1])
        lowered += floors.probed(key, started, found)
    return lowered


def _statement(dialect: Dialect, key: FloorKey) -> Select[Any]:
    return cached_statement(
        ("floor-probe", type(dialect), key.queues, key.job_types),
        lambda: dialect.floor_probe_statement(queues=key.queues, job_types=key.job_types),
    )
