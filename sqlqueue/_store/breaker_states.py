"""The circuit breaker of a key: may an attempt pass, and what its outcome does to the state.

Every statement is conditional on the state it expects, so concurrent workers cannot both win:
one UPDATE takes the single probe (``open`` past its cool-down, or ``half_open`` with no live
probe → ``half_open`` held by this attempt), and only the probe's holder can close or re-open
the breaker. A probe is live while its job is still ``running`` under the same attempt, so a
probe whose worker died is freed as soon as the reaper recovers its job.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Integer, and_, bindparam, case, exists, or_, select, update
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._schema import circuit_breakers as breakers
from sqlqueue._schema import jobs
from sqlqueue.dialects import Dialect

__all__ = [
    "BreakerState",
    "Passage",
    "pass_breaker",
    "read_breaker",
    "record_failure",
    "record_neutral",
    "record_success",
]

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass(frozen=True, kw_only=True)
class Passage:
    """Whether an attempt may pass: as a plain pass, as the probe, or not before ``wait`` s.

    ``wait`` is ``None`` for a refusal whose end is unknown (another attempt's probe is running).
    """

    allowed: bool
    probe: bool = False
    wait: float | None = None


@dataclass(frozen=True, kw_only=True)
class BreakerState:
    """One breaker row, as stored."""

    key: str
    state: str
    failures: int
    streak_started_at: datetime | None
    open_until: datetime | None
    probe_job_id: int | None
    probe_attempt: int | None
    changed_at: datetime


def _probe_is_live() -> ColumnElement[bool]:
    return exists().where(
        jobs.c.id == breakers.c.probe_job_id,
        jobs.c.attempts == breakers.c.probe_attempt,
        jobs.c.status == "running",
    )


def pass_breaker(
    conn: Connection,
    dialect: Dialect,
    *,
    key: str,
    fence: tuple[int, int],
    now: datetime | None = None,
) -> Passage:
    """Let the attempt ``fence`` (job id, attempt) through ``key``'s breaker, or say how long to
    wait. A closed (or never used) breaker costs one read and writes nothing."""
    current = dialect.now(now)
    row = _read_with_clock(conn, key, current)
    if row is None or row["state"] == CLOSED:
        return Passage(allowed=True)
    if row["state"] == OPEN and row["open_until"] > row["db_now"]:
        return Passage(allowed=False, wait=(row["open_until"] - row["db_now"]).total_seconds())
    job_id, attempt = fence
    take_probe = (
        update(breakers)
        .where(
            breakers.c.key == key,
            or_(
                and_(breakers.c.state == OPEN, breakers.c.open_until <= current),
                and_(
                    breakers.c.state == HALF_OPEN,
                    or_(breakers.c.probe_job_id.is_(None), ~_probe_is_live()),
                ),
            ),
        )
        .values(state=HALF_OPEN, probe_job_id=job_id, probe_attempt=attempt, changed_at=current)
        .returning(breakers.c.key)
    )
    if dialect.execute_returning(conn, take_probe).first() is not None:
        return Passage(allowed=True, probe=True)
    row = _read_with_clock(conn, key, current)  # someone else moved first: where are we now?
    if row is None or row["state"] == CLOSED:
        return Passage(allowed=True)
    if row["state"] == OPEN and row["open_until"] > row["db_now"]:
        return Passage(allowed=False, wait=(row["open_until"] - row["db_now"]).total_seconds())
    return Passage(allowed=False)


def _read_with_clock(conn: Connection, key: str, current: ColumnElement[datetime]) -> Any:
    query = select(breakers, current.label("db_now")).where(breakers.c.key == key)
    return conn.execute(query).mappings().first()


def _holds_probe(key: str, fence: tuple[int, int]) -> list[ColumnElement[bool]]:
    return [
        breakers.c.key == key,
        breakers.c.state == HALF_OPEN,
        breakers.c.probe_job_id == fence[0],
        breakers.c.probe_attempt == fence[1],
    ]


def record_success(
    conn: Connection,
    dialect: Dialect,
    *,
    key: str,
    fence: tuple[int, int],
    probe: bool,
    now: datetime | None = None,
) -> str | None:
    """A success: the probe's closes the breaker; any other ends a closed breaker's failure
    streak. Returns the new state when this changed it to ``closed``, else ``None``."""
    current = dialect.now(now)
    if probe:
        stmt = (
            update(breakers)
            .where(*_holds_probe(key, fence))
            .values(
                state=CLOSED,
                failures=0,
                streak_started_at=None,
                open_until=None,
                probe_job_id=None,
                probe_attempt=None,
                changed_at=current,
            )
            .returning(breakers.c.state)
        )
        return dialect.execute_returning(conn, stmt).scalar_one_or_none()
    conn.execute(
        update(breakers)
        .where(breakers.c.key == key, breakers.c.state == CLOSED, breakers.c.failures > 0)
        .values(failures=0, streak_started_at=None, changed_at=current)
    )
    return None


def record_failure(
    conn: Connection,
    dialect: Dialect,
    *,
    key: str,
    fence: tuple[int, int],
    probe: bool,
    failure_threshold: int,
    window_seconds: float,
    cooldown_seconds: float,
    now: datetime | None = None,
) -> str | None:
    """A failure: the probe's re-opens the breaker; any other extends a closed breaker's streak
    (a streak whose first failure is older than ``window_seconds`` starts again at one) and
    opens it at ``failure_threshold``. Returns ``"open"`` when this opened it, else ``None``.

    Results of attempts that passed before the breaker opened are ignored while it is open or
    half-open: only the probe speaks for the key then.
    """
    current = dialect.now(now)
    reopen_at = dialect.now_plus(cooldown_seconds, now)
    if probe:
        stmt = (
            update(breakers)
            .where(*_holds_probe(key, fence))
            .values(
                state=OPEN,
                open_until=reopen_at,
                probe_job_id=None,
                probe_attempt=None,
                changed_at=current,
            )
            .returning(breakers.c.state)
        )
        return dialect.execute_returning(conn, stmt).scalar_one_or_none()
    threshold = bindparam("failure_threshold", failure_threshold, type_=Integer())
    in_window = breakers.c.streak_started_at >= dialect.now_plus(-window_seconds, now)
    streak = case((and_(breakers.c.failures > 0, in_window), breakers.c.failures + 1), else_=1)
    opens = streak >= threshold
    first_opens = failure_threshold <= 1
    upsert = dialect.upsert(
        breakers,
        values={
            "key": key,
            "state": OPEN if first_opens else CLOSED,
            "failures": 1,
            "streak_started_at": current,
            "open_until": reopen_at if first_opens else None,
            "changed_at": current,
        },
        conflict=["key"],
        set_={
            "failures": streak,
            "streak_started_at": case((streak == 1, current), else_=breakers.c.streak_started_at),
            "state": case((opens, OPEN), else_=CLOSED),
            "open_until": case((opens, reopen_at), else_=None),
            "changed_at": current,
        },
        where=breakers.c.state == CLOSED,
    ).returning(breakers.c.state)
    state = dialect.execute_returning(conn, upsert).scalar_one_or_none()
    return OPEN if state == OPEN else None


def record_neutral(
    conn: Connection,
    dialect: Dialect,
    *,
    key: str,
    fence: tuple[int, int],
    now: datetime | None = None,
) -> None:
    """An outcome that says nothing about the key's health (a snooze, a permanent error): the
    probe, if this attempt held it, is handed back for another attempt to take."""
    conn.execute(
        update(breakers)
        .where(*_holds_probe(key, fence))
        .values(probe_job_id=None, probe_attempt=None, changed_at=dialect.now(now))
    )


def read_breaker(conn: Connection, key: str) -> BreakerState | None:
    """The stored state of ``key``'s breaker, or ``None`` if it never recorded anything."""
    row = conn.execute(select(breakers).where(breakers.c.key == key)).mappings().first()
    return BreakerState(**row) if row is not None else None
