"""Liveness checks on pooled connections, for the engines sqlqueue builds from a URL.

A connection the server dropped while it sat in the pool (a terminated backend, a restart, an
idle timeout) should be replaced at checkout, not fail the next claim, completion or enqueue
and start a backoff. ``pool_pre_ping`` does that with a round trip (on PostgreSQL a transaction
of its own) before every checkout, which a busy enqueuer or worker pays thousands of times a
second. These checks keep the benefit for less:

- every checkout asks the dialect whether the connection is known dead without a round trip
  (PostgreSQL: the server's farewell or end-of-file is waiting on the socket);
- a connection unused for :data:`PING_AFTER_IDLE_SECONDS` or more is also pinged, as pre-ping
  would, for what the socket cannot tell (a silent network drop);
- after an error that means disconnection, SQLAlchemy itself marks every older connection of
  the pool stale, and replaces each at its next checkout.

A failed check raises :class:`~sqlalchemy.exc.DisconnectionError` from the pool's ``checkout``
event, so the pool discards that connection and checks out a fresh one (SQLAlchemy's documented
custom pessimistic-ping recipe).
"""

from __future__ import annotations

import time
from typing import Any, Final

from sqlalchemy import Engine, event
from sqlalchemy import exc as sa_exc

from sqlqueue.dialects import Dialect

__all__ = ["PING_AFTER_IDLE_SECONDS", "check_connections_at_checkout"]

#: Idle time after which a pooled connection is pinged before use.
PING_AFTER_IDLE_SECONDS: Final = 1.0
#: The connection record's ``info`` key holding when the connection was last checked out
#: (``info`` is cleared with the connection it describes).
_LAST_CHECKOUT: Final = "sqlqueue_last_checkout"


def check_connections_at_checkout(
    engine: Engine, dialect: Dialect, *, ping_after_idle: float = PING_AFTER_IDLE_SECONDS
) -> None:
    """Install the checks on ``engine``'s pool (once per engine).

    Idle time is counted from the previous checkout (one event per use instead of two): a
    connection held for a long transaction may be pinged once more than needed.
    """

    def checkout(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        info = record.info
        now = time.monotonic()
        last = info.get(_LAST_CHECKOUT)
        info[_LAST_CHECKOUT] = now
        if last is None:  # just connected
            return
        if dialect.connection_dropped(dbapi_connection):
            raise sa_exc.DisconnectionError("the server closed this pooled connection")
        if now - last >= ping_after_idle and not _ping(engine, dbapi_connection):
            raise sa_exc.DisconnectionError("this pooled connection did not answer a ping")

    event.listen(engine, "checkout", checkout)


def _ping(engine: Engine, dbapi_connection: Any) -> bool:
    """The dialect's own ping (what ``pool_pre_ping`` sends); ``False`` if it fails."""
    try:
        return bool(engine.dialect.do_ping(dbapi_connection))
    except Exception:  # any failure: the connection is not worth handing out
        return False
