"""Enqueue: check each request, then write its row in the caller's transaction.

Every check happens before any SQL is sent, so a rejected request leaves no row and the
caller's transaction usable. The INSERTs themselves live in the store.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from sqlqueue._errors import ConfigurationError, EnqueueError, UnknownJobType
from sqlqueue._payload import check_payload
from sqlqueue._store._tx import translated
from sqlqueue._store.inserts import insert_rows
from sqlqueue._task import JobRequest, Task
from sqlqueue.dialects import Dialect

__all__ = ["EnqueueSettings", "Executable", "enqueue_jobs", "to_connection"]

#: What ``enqueue`` writes through: the caller's connection or ORM session (or an engine,
#: which then gets a transaction of its own).
Executable = Connection | Session | Engine

_MAX_PRIORITY = 1_000_000


@dataclass(frozen=True, kw_only=True)
class EnqueueSettings:
    """What enqueue needs from its queue: the registry, defaults and limits."""

    tasks: Mapping[str, Task]
    default_queue: str
    max_payload_bytes: int
    dialect: Dialect


@contextmanager
def to_connection(target: Executable) -> Iterator[Connection]:
    """The connection of the caller's transaction (an engine gets a transaction of its own)."""
    if isinstance(target, Connection):
        yield target
    elif isinstance(target, Session):
        yield target.connection()
    elif isinstance(target, Engine):
        with target.begin() as conn:
            yield conn
    else:
        raise ConfigurationError(
            "enqueue writes in your transaction: pass a SQLAlchemy Connection or Session "
            f"(or an Engine for a transaction of its own), got {type(target).__name__}"
        )


def build_row(settings: EnqueueSettings, request: JobRequest) -> dict[str, Any]:
    """Check one request and turn it into insert parameters; raise before any SQL is sent."""
    task = settings.tasks.get(request.job_type)
    if task is None and not request.external:
        known = ", ".join(sorted(settings.tasks)) or "none"
        raise UnknownJobType(
            f"no task named {request.job_type!r} on this queue (known: {known}); pass "
            "external=True if another service's workers handle it"
        )
    if not isinstance(request.job_type, str) or not 0 < len(request.job_type) <= 200:
        raise EnqueueError(
            f"job_type must be a string of 1..200 characters, got {request.job_type!r}"
        )
    payload = check_payload(request.payload, max_bytes=settings.max_payload_bytes)
    if request.delay is not None and request.run_at is not None:
        raise EnqueueError("give either delay or run_at, not both")
    if request.delay is not None and request.delay < 0:
        raise EnqueueError(f"delay must be >= 0 seconds, got {request.delay!r}")
    if request.run_at is not None and (
        not isinstance(request.run_at, datetime) or request.run_at.tzinfo is None
    ):
        raise EnqueueError(f"run_at must be a timezone-aware datetime, got {request.run_at!r}")
    max_attempts = _pick(request.max_attempts, task.max_attempts if task else None, 8)
    if max_attempts < 1:
        raise EnqueueError(f"max_attempts must be >= 1, got {max_attempts!r}")
    priority = _pick(request.priority, task.priority if task else None, 0)
    if not -_MAX_PRIORITY <= priority <= _MAX_PRIORITY:
        raise EnqueueError(f"priority must be within ±{_MAX_PRIORITY}, got {priority!r}")
    queue = request.queue or (task.queue if task else settings.default_queue)
    key = request.idempotency_key
    if key is not None and (not isinstance(key, str) or not 0 < len(key) <= 255):
        raise EnqueueError(f"idempotency_key must be a string of 1..255 characters, got {key!r}")
    group = request.group_key
    if group is not None and (not isinstance(group, str) or not 0 < len(group) <= 255):
        raise EnqueueError(f"group_key must be a string of 1..255 characters, got {group!r}")
    return {
        "job_type": request.job_type,
        "queue": queue,
        "priority": priority,
        "payload": payload,
        "status": "queued",
        "attempts": 0,
        "max_attempts": max_attempts,
        "errors": [],
        "idempotency_key": key,
        "group_key": group,
        "_run_at": request.run_at,
        "_delay": float(request.delay or 0.0),
    }


def _pick(value: int | None, task_default: int | None, default: int) -> int:
    if value is not None:
        return value
    return task_default if task_default is not None else default


def enqueue_jobs(
    settings: EnqueueSettings, target: Executable, requests: Sequence[JobRequest]
) -> list[int]:
    """Insert ``requests`` in the caller's transaction and return one id per request, in order.

    A request whose idempotency key already exists (committed, or earlier in this batch)
    gets the existing job's id and writes nothing.
    """
    rows = [build_row(settings, request) for request in requests]
    if not rows:
        return []

    def write() -> list[int]:
        with to_connection(target) as conn:
            return insert_rows(settings.dialect, conn, rows)

    return translated(settings.dialect, write)
