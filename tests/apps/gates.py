"""Tasks behind a rate limit and a circuit breaker, and the ledger their handlers write.

Every execution appends one row — (key, endpoint, pid, started, finished) — in its own
autocommitted transaction, so the tests measure rates and probes from data, not logs. The
payload's ``endpoint`` is the gate key (``endpoint:<name>``), as a webhook sender's would be.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import sqlqueue

__all__ = [
    "BREAKER_COOLDOWN",
    "BREAKER_THRESHOLD",
    "GATE_LEDGER",
    "RATE_BURST",
    "RATE_PER_SECOND",
    "create_gate_ledger",
    "read_gate_ledger",
    "register_gate_tasks",
]

#: ``gates.limited``: at most this many starts per second per endpoint, in bursts of up to …
RATE_PER_SECOND = 5.0
RATE_BURST = 2.0
#: ``gates.call``: opens after this many consecutive failures, stays open this long.
BREAKER_THRESHOLD = 2
BREAKER_COOLDOWN = 3.0

_metadata = sa.MetaData()

GATE_LEDGER = sa.Table(
    "test_gate_ledger",
    _metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("key", sa.String(100), nullable=False),
    sa.Column("endpoint", sa.String(100), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("started", sa.Double, nullable=False),
    sa.Column("finished", sa.Double, nullable=True),
)

#: One ledger row: ``id, key, endpoint, pid, started, finished`` (epoch seconds).
GateLedgerRow = sa.Row[Any]


def create_gate_ledger(engine: sa.Engine) -> None:
    """Create the ledger table (the test owns it; sqlqueue's migrations do not know it)."""
    _metadata.create_all(engine)


def read_gate_ledger(engine: sa.Engine) -> list[GateLedgerRow]:
    """Every ledger row, in start order."""
    with engine.connect() as conn:
        query = sa.select(GATE_LEDGER).order_by(GATE_LEDGER.c.started, GATE_LEDGER.c.id)
        return list(conn.execute(query).all())


def _endpoint_key(payload: Any) -> str:
    return f"endpoint:{payload['endpoint']}"


def register_gate_tasks(queue: sqlqueue.Queue) -> None:
    """Register ``gates.limited`` and ``gates.call`` on ``queue``; its engine writes the ledger."""
    engine = queue.engine

    def start(key: str, endpoint: str) -> int:
        row = {"key": key, "endpoint": endpoint, "pid": os.getpid(), "started": time.time()}
        with engine.begin() as conn:
            stmt = GATE_LEDGER.insert().values(**row).returning(GATE_LEDGER.c.id)
            return int(conn.execute(stmt).scalar_one())

    def finish(ledger_id: int) -> None:
        with engine.begin() as conn:
            stmt = GATE_LEDGER.update().where(GATE_LEDGER.c.id == ledger_id)
            conn.execute(stmt.values(finished=time.time()))

    @queue.task(
        "gates.limited",
        rate_limit=sqlqueue.RateLimit(
            per_second=RATE_PER_SECOND, burst=RATE_BURST, key=_endpoint_key
        ),
    )
    def limited(key: str, endpoint: str) -> None:
        """One call to a rate-limited endpoint: a ledger row, nothing else."""
        finish(start(key, endpoint))

    @queue.task(
        "gates.call",
        backoff=sqlqueue.schedule([0]),
        circuit_breaker=sqlqueue.CircuitBreaker(
            failure_threshold=BREAKER_THRESHOLD,
            window_seconds=60,
            cooldown_seconds=BREAKER_COOLDOWN,
            key=_endpoint_key,
        ),
    )
    def call(
        key: str, endpoint: str, seconds: float = 0.0, fail: bool = False, gate: str = ""
    ) -> None:
        """One call to an endpoint behind a breaker: takes ``seconds``, fails if ``fail``;
        with a ``gate``, it then lasts until that file exists (at most a minute), so a test
        decides when the endpoint answers."""
        ledger_id = start(key, endpoint)
        time.sleep(seconds)
        deadline = time.monotonic() + 60
        while gate and not Path(gate).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{gate} was never created")
            time.sleep(0.02)
        finish(ledger_id)
        if fail:
            raise ConnectionError(f"{endpoint} refused the connection")

    _ = (limited, call)
