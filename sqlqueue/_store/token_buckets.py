"""The token bucket of a rate-limit key: take one token in one atomic statement, or say when the
next one is due.

A bucket holds ``tokens`` as counted at ``refilled_at`` (database time). Taking computes the
refill since then in SQL — ``min(capacity, tokens + elapsed * per_second)`` — and, where at least
one token is there, stores that minus one: ``INSERT … ON CONFLICT DO UPDATE … WHERE available
>= 1 RETURNING``. The first take of a key inserts a full bucket less one. The row lock
(PostgreSQL) or the write lock (SQLite) makes concurrent takes queue up, so no token is spent
twice.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, Float, bindparam, case, select
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._schema import rate_limits
from sqlqueue.dialects import Dialect

__all__ = ["read_bucket", "take_token"]


def _available(
    dialect: Dialect, current: ColumnElement[datetime], per_second: float, capacity: float
) -> ColumnElement[float]:
    """The bucket's tokens at ``current``: the stored count plus the refill, capped at capacity.

    A ``refilled_at`` later than ``current`` (another transaction's statement started after ours
    but committed first) refills nothing rather than a negative amount.
    """
    elapsed = dialect.seconds_between(current, rate_limits.c.refilled_at)
    rate = bindparam("per_second", per_second, type_=Float())
    cap = bindparam("capacity", capacity, type_=Float())
    refill = case((elapsed > 0, elapsed * rate), else_=0.0)
    total = rate_limits.c.tokens + refill
    return case((total > cap, cap), else_=total)


def take_token(
    conn: Connection,
    dialect: Dialect,
    *,
    key: str,
    per_second: float,
    capacity: float,
    now: datetime | None = None,
) -> float | None:
    """Take one token from ``key``'s bucket: ``None`` when taken, else the seconds until the next
    token is due (by the database clock)."""
    current = dialect.now(now)
    available = _available(dialect, current, per_second, capacity)
    take = dialect.upsert(
        rate_limits,
        values={
            "key": key,
            "tokens": bindparam("first_tokens", capacity - 1.0, type_=Float()),
            "refilled_at": current,
        },
        conflict=["key"],
        set_={
            "tokens": available - 1.0,
            "refilled_at": case(
                (rate_limits.c.refilled_at > current, rate_limits.c.refilled_at), else_=current
            ),
        },
        where=available >= 1.0,
    ).returning(rate_limits.c.key)
    if dialect.execute_returning(conn, take).first() is not None:
        return None
    rate = bindparam("rate", per_second, type_=Float())
    due = select((1.0 - available) / rate).where(rate_limits.c.key == key)
    wait = conn.execute(due).scalar_one()
    return max(0.0, float(wait))


def read_bucket(conn: Connection, key: str) -> tuple[float, datetime] | None:
    """``(tokens, refilled_at)`` of ``key``'s bucket as last stored, or ``None``."""
    query = select(rate_limits.c.tokens, rate_limits.c.refilled_at).where(rate_limits.c.key == key)
    row = conn.execute(query).first()
    return (float(row[0]), row[1]) if row is not None else None
