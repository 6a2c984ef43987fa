"""The database clock of a dialect: every time sqlqueue compares or stores comes from the
database, never from a worker's clock (leases, due jobs, heartbeats)."""

from __future__ import annotations

import abc
from datetime import datetime, timedelta

from sqlalchemy import (
    Float,
    bindparam,
    func,
    literal,
)
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._types import UtcDateTime

__all__ = ["Clock"]


class Clock(abc.ABC):
    """The database's time, and arithmetic on it, as SQL expressions."""

    @abc.abstractmethod
    def clock(self) -> ColumnElement[datetime]:
        """The database's current time, evaluated once per statement."""

    @abc.abstractmethod
    def clock_plus(self, seconds: ColumnElement[float]) -> ColumnElement[datetime]:
        """The database time ``seconds`` from now (negative goes back)."""

    def now(self, at: datetime | None = None) -> ColumnElement[datetime]:
        """The database clock, or the injected instant ``at`` (tests pass one to be exact)."""
        if at is not None:
            return literal(at, UtcDateTime())
        return self.clock()

    def now_plus(
        self, seconds: float | ColumnElement[float], at: datetime | None = None
    ) -> ColumnElement[datetime]:
        """``now`` plus ``seconds``; a plain float is bound, never formatted into SQL."""
        if at is not None:
            if isinstance(seconds, int | float):
                return literal(at + timedelta(seconds=seconds), UtcDateTime())
            raise TypeError("an injected clock needs a constant offset")
        offset = (
            bindparam(None, float(seconds), type_=Float())
            if isinstance(seconds, int | float)
            else seconds
        )
        return self.clock_plus(offset)

    @abc.abstractmethod
    def seconds_between(
        self, later: ColumnElement[datetime], earlier: ColumnElement[datetime]
    ) -> ColumnElement[float]:
        """``later - earlier`` in (fractional) seconds, computed by the database."""

    def minutes_between(
        self, later: ColumnElement[datetime], earlier: ColumnElement[datetime]
    ) -> ColumnElement[int]:
        """The whole minutes from ``earlier`` to ``later`` (rounded down; for buckets of a
        per-minute chart)."""
        return func.floor(self.seconds_between(later, earlier) / 60.0)
