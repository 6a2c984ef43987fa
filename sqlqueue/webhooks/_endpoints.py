"""Webhook endpoints as rows of ``sqlqueue_webhook_endpoints``: the value the API hands out,
and the few portable Core statements that read and change them (every value bound).

Times come from the database clock. Secrets are kept newest first, each with the end of its
grace (``None`` for the current one); a secret past its grace is neither used nor shown. Each
statement carries the queue dialect's ``table_options`` (the table's schema): it runs on the
caller's connection, which stays as the caller set it up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from sqlqueue import ConfigurationError
from sqlqueue._schema import webhook_endpoints
from sqlqueue.dialects import Dialect
from sqlqueue.webhooks._errors import UnknownEndpoint

__all__ = [
    "Endpoint",
    "Executable",
    "check_name",
    "check_retry_statuses",
    "insert_endpoint",
    "read_endpoint",
    "read_endpoints",
    "rotate_secrets",
    "set_enabled",
]

#: Where the app's writes go: a Core connection or an ORM session, in the caller's transaction.
Executable = Connection | Session

_MAX_NAME = 200
_table = webhook_endpoints


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """One receiver of webhooks: where deliveries go and how they are signed.

    ``secrets`` are the secrets that sign right now, newest first: one, or two or more during a
    rotation's grace. ``retry_statuses`` are the 4xx answers this receiver means as "try again
    later" (other 4xx send the delivery to dead). A disabled endpoint's deliveries go to dead
    saying ``disabled_reason``.
    """

    name: str
    url: str
    secrets: tuple[str, ...] = field(repr=False)  # never in logs
    retry_statuses: tuple[int, ...]
    enabled: bool
    disabled_reason: str | None
    created_at: datetime
    updated_at: datetime
    #: The database time this snapshot was read at (and its ``secrets`` judged current).
    read_at: datetime

    @property
    def secret(self) -> str:
        """The newest secret: the one to give the receiver."""
        return self.secrets[0]


def check_name(name: object) -> str:
    """``name`` if it can name an endpoint (and a gate key), else a ConfigurationError."""
    if not isinstance(name, str) or not 1 <= len(name) <= _MAX_NAME:
        raise ConfigurationError(
            f"name must be a string of 1..{_MAX_NAME} characters, got {name!r}"
        )
    return name


def check_retry_statuses(statuses: Sequence[int]) -> tuple[int, ...]:
    """The 4xx statuses to retry, each checked to be one."""
    checked = []
    for status in statuses:
        if not isinstance(status, int) or isinstance(status, bool) or not 400 <= status <= 499:
            raise ConfigurationError(
                f"retry_statuses holds 4xx statuses only (5xx, 408 and 429 are always "
                f"retried), got {status!r}"
            )
        checked.append(status)
    return tuple(sorted(set(checked)))


def _execute(conn: Executable, dialect: Dialect, statement: Any) -> Any:
    """``conn.execute(statement)`` on the endpoints table in the dialect's schema, through the
    dialect's ``RETURNING`` and ``ON CONFLICT`` (emulated where the backend lacks them)."""
    return dialect.execute_returning(conn, statement, execution_options=dialect.table_options)


def _now(conn: Executable, dialect: Dialect) -> datetime:
    value = conn.execute(select(dialect.clock())).scalar_one()
    assert isinstance(value, datetime)
    return value


def _current(secrets: list[dict[str, Any]], now: datetime) -> tuple[str, ...]:
    return tuple(
        entry["secret"]
        for entry in secrets
        if entry.get("expires_at") is None or datetime.fromisoformat(entry["expires_at"]) > now
    )


def _endpoint(row: Any, now: datetime) -> Endpoint:
    return Endpoint(
        name=row.name,
        url=row.url,
        secrets=_current(row.secrets, now),
        retry_statuses=tuple(row.retry_statuses),
        enabled=bool(row.enabled),
        disabled_reason=row.disabled_reason,
        created_at=row.created_at,
        updated_at=row.updated_at,
        read_at=now,
    )


def insert_endpoint(
    conn: Executable,
    dialect: Dialect,
    *,
    name: str,
    url: str,
    secret: str,
    retry_statuses: tuple[int, ...],
) -> Endpoint:
    """Write a new endpoint; a name already taken is a ConfigurationError.

    ``ON CONFLICT DO NOTHING``: a name taken by another transaction that has not committed yet
    (so no read could see it) waits for it and then says so too, rather than failing with the
    driver's unique violation, which on PostgreSQL would also abort the caller's transaction.
    """
    now = _now(conn, dialect)
    inserted = _execute(
        conn,
        dialect,
        dialect.conflict_insert(_table)
        .values(
            name=name,
            url=url,
            secrets=[{"secret": secret, "expires_at": None}],
            retry_statuses=list(retry_statuses),
            enabled=True,
            disabled_reason=None,
            created_at=now,
            updated_at=now,
        )
        .on_conflict_do_nothing(index_elements=[_table.c.name])
        .returning(_table.c.name),
    ).first()
    if inserted is None:
        raise ConfigurationError(f"an endpoint named {name!r} already exists")
    return _require(conn, dialect, name)


def read_endpoint(
    conn: Executable, dialect: Dialect, name: str, *, now: datetime | None = None
) -> Endpoint | None:
    """The endpoint named ``name`` as of ``now`` (default: the database clock), or ``None``."""
    row = _execute(
        conn, dialect, select(_table, dialect.now(now).label("now")).where(_table.c.name == name)
    ).one_or_none()
    return None if row is None else _endpoint(row, row.now)


def read_endpoints(conn: Executable, dialect: Dialect) -> list[Endpoint]:
    """Every endpoint, by name."""
    rows = _execute(
        conn, dialect, select(_table, dialect.clock().label("now")).order_by(_table.c.name)
    )
    return [_endpoint(row, row.now) for row in rows]


def _require(conn: Executable, dialect: Dialect, name: str) -> Endpoint:
    endpoint = read_endpoint(conn, dialect, name)
    if endpoint is None:
        raise UnknownEndpoint(f"no webhook endpoint named {name!r}")
    return endpoint


def rotate_secrets(
    conn: Executable, dialect: Dialect, name: str, *, secret: str, grace: float
) -> Endpoint:
    """Make ``secret`` the newest; the others keep signing for ``grace`` seconds more (those
    already closer to their end keep it), and secrets past their grace are dropped.

    Read-modify-write, so the row is taken first, until the caller's transaction ends: a
    concurrent rotation waits and then starts from this one's secrets instead of writing its
    own list over them. The first statement writes (``updated_at``) and returns the secrets:
    on PostgreSQL the UPDATE holds the row's lock and returns its newest version; on SQLite it
    takes the database's write lock (the driver opens its transaction at the first write, so
    a SELECT first would read outside it, and ``lock_row`` is a no-op there) and the secrets
    are read under that lock. One statement locks and reads on both backends, so no
    ``SELECT … FOR UPDATE`` is needed.
    """
    row = _execute(
        conn,
        dialect,
        _table.update()
        .where(_table.c.name == name)
        .values(updated_at=dialect.clock())
        .returning(_table.c.secrets, _table.c.updated_at),
    ).one_or_none()
    if row is None:
        raise UnknownEndpoint(f"no webhook endpoint named {name!r}")
    now: datetime = row.updated_at
    until = now + timedelta(seconds=grace)
    kept = [{"secret": secret, "expires_at": None}]
    for entry in row.secrets:
        ends = entry.get("expires_at")
        end = until if ends is None else min(until, datetime.fromisoformat(ends))
        if end > now and entry["secret"] != secret:
            kept.append({"secret": entry["secret"], "expires_at": end.isoformat()})
    _execute(conn, dialect, _table.update().where(_table.c.name == name).values(secrets=kept))
    return _require(conn, dialect, name)


def set_enabled(
    conn: Executable, dialect: Dialect, name: str, *, enabled: bool, reason: str | None
) -> Endpoint:
    """Enable an endpoint (clearing its reason) or disable it saying why."""
    done = _execute(
        conn,
        dialect,
        _table.update()
        .where(_table.c.name == name)
        .values(enabled=enabled, disabled_reason=reason, updated_at=dialect.clock()),
    )
    if done.rowcount == 0:
        raise UnknownEndpoint(f"no webhook endpoint named {name!r}")
    return _require(conn, dialect, name)
