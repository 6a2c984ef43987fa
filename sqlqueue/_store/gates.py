"""The gates' transactions: pass a job's circuit breaker and rate limit together, record what
its attempt did to the breaker, and read the state back.

Passing is all or nothing: the breaker is asked first (a refused attempt takes no token, so a
key whose breaker is open never starves other keys that share its rate limit), then a token is
taken; when the rate limit refuses, the transaction rolls back, so a probe taken a moment
before is not held by an attempt that will not run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from sqlalchemy import Connection, Engine

from sqlqueue._store import breaker_states
from sqlqueue._store.breaker_states import BreakerState
from sqlqueue._store.token_buckets import read_bucket, take_token
from sqlqueue._store.transactions import in_read, in_write
from sqlqueue.dialects import Dialect

__all__ = ["BreakerCheck", "GateTransactions", "RateCheck", "Verdict"]

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RateCheck:
    """Take a token of ``key``'s bucket."""

    key: str
    per_second: float
    capacity: float


@dataclass(frozen=True, kw_only=True)
class BreakerCheck:
    """Pass ``key``'s circuit breaker."""

    key: str


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """May the attempt run? If not, which gate refused and for how long (``None``: unknown)."""

    allowed: bool
    probe: bool = False
    refused_by: str = ""
    wait: float | None = None


class GateTransactions:
    """The gates' operations, part of :class:`~sqlqueue._store.store.Store`; each method is one
    short transaction on the store's engine."""

    engine: Engine
    dialect: Dialect

    def _write(
        self,
        operation: Callable[[Connection], T],
        *,
        keep: Callable[[T], bool] = lambda _: True,
        relaxed: bool = False,
    ) -> T:
        """Run ``operation`` in a write transaction; commit if ``keep(result)``, else roll back.

        ``relaxed``: the commit need not wait for the disk (a breaker record lost in a database
        crash costs one failure or success not counted). Token and probe takes stay durable:
        losing one would let an extra attempt through.
        """

        return in_write(self.engine, self.dialect, operation, relaxed=relaxed, keep=keep)

    def pass_gates(
        self,
        *,
        fence: tuple[int, int],
        breaker: BreakerCheck | None,
        rate: RateCheck | None,
        now: datetime | None = None,
    ) -> Verdict:
        """Pass the breaker, then take a token; all or nothing (see the module docstring)."""

        def decide(conn: Connection) -> Verdict:
            probe = False
            if breaker is not None:
                passage = breaker_states.pass_breaker(
                    conn, self.dialect, key=breaker.key, fence=fence, now=now
                )
                if not passage.allowed:
                    return Verdict(allowed=False, refused_by="breaker", wait=passage.wait)
                probe = passage.probe
            if rate is not None:
                wait = take_token(
                    conn,
                    self.dialect,
                    key=rate.key,
                    per_second=rate.per_second,
                    capacity=rate.capacity,
                    now=now,
                )
                if wait is not None:
                    return Verdict(allowed=False, probe=probe, refused_by="rate_limit", wait=wait)
            return Verdict(allowed=True, probe=probe)

        # A refusal wrote nothing but a probe taken before the rate limit refused: only that
        # is rolled back (a ROLLBACK also costs psycopg its prepared statements, see
        # ``transactions.py``; a refused token or breaker pass is committed as the no-op it is).
        return self._write(decide, keep=lambda verdict: verdict.allowed or not verdict.probe)

    def record_success(
        self, *, key: str, fence: tuple[int, int], probe: bool, now: datetime | None = None
    ) -> str | None:
        """See :func:`breaker_states.record_success`."""
        return self._write(
            lambda conn: breaker_states.record_success(
                conn, self.dialect, key=key, fence=fence, probe=probe, now=now
            ),
            relaxed=True,
        )

    def record_failure(
        self,
        *,
        key: str,
        fence: tuple[int, int],
        probe: bool,
        failure_threshold: int,
        window_seconds: float,
        cooldown_seconds: float,
        now: datetime | None = None,
    ) -> str | None:
        """See :func:`breaker_states.record_failure`."""
        return self._write(
            lambda conn: breaker_states.record_failure(
                conn,
                self.dialect,
                key=key,
                fence=fence,
                probe=probe,
                failure_threshold=failure_threshold,
                window_seconds=window_seconds,
                cooldown_seconds=cooldown_seconds,
                now=now,
            ),
            relaxed=True,
        )

    def record_neutral(
        self, *, key: str, fence: tuple[int, int], now: datetime | None = None
    ) -> None:
        """See :func:`breaker_states.record_neutral`."""
        self._write(
            lambda conn: breaker_states.record_neutral(
                conn, self.dialect, key=key, fence=fence, now=now
            ),
            relaxed=True,
        )

    def read_breaker(self, key: str) -> BreakerState | None:
        """The stored state of ``key``'s circuit breaker, or ``None``."""
        return in_read(
            self.engine, self.dialect, lambda conn: breaker_states.read_breaker(conn, key)
        )

    def read_bucket(self, key: str) -> tuple[float, datetime] | None:
        """``(tokens, refilled_at)`` of ``key``'s rate-limit bucket as last stored, or ``None``."""
        return in_read(self.engine, self.dialect, lambda conn: read_bucket(conn, key))
