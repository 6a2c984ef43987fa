"""The limits of sqlqueue's columns, read from the schema, and the checks that hold values to them.

Everything that reaches a column (an enqueue's options, a task's declaration, an operator's
filter or action) passes one of these checks before any SQL is sent, so bad input gets a typed
error naming the field and the limit instead of a driver error, an aborted transaction
(PostgreSQL) or a silently wrong answer (SQLite). The limits come from the ``Column`` objects
of ``sqlqueue._schema``, the one source of truth: a ``String(n)`` holds at most ``n``
characters, an integer column the range of its SQL type, a timestamp the years every supported
database stores. What no backend stores in text is refused everywhere: NUL (PostgreSQL cannot
store it; SQLite's ``LIKE`` stops at it) and lone surrogates (not UTF-8).

Callers pass the error type their users expect: ``EnqueueError`` at enqueue,
``ConfigurationError`` at declaration and for operators' filters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import BigInteger, Column, DateTime, Integer, SmallInteger, String
from sqlalchemy.types import TypeDecorator

from sqlqueue._errors import ConfigurationError, EnqueueError, SqlqueueError
from sqlqueue._moments import CLOCK_MARGIN_SECONDS, SURELY_STORABLE_DELAY, delay_problem
from sqlqueue._moments import EARLIEST as MOMENTS_EARLIEST
from sqlqueue._moments import LATEST as MOMENTS_LATEST
from sqlqueue._schema import job_actions, jobs, queues

__all__ = [
    "EARLIEST",
    "LATEST",
    "MAX_PRIORITY",
    "check_action",
    "check_age",
    "check_declaration",
    "check_delay",
    "check_enqueue",
    "check_filter",
    "check_ids",
    "check_integer",
    "check_moment",
    "check_queue_name",
    "check_text",
    "integer_range",
    "moment_range",
    "text_length",
]

#: The instants every supported database stores (see ``sqlqueue/_moments.py``).
EARLIEST, LATEST = MOMENTS_EARLIEST, MOMENTS_LATEST
_CLOCK_MARGIN_SECONDS = CLOCK_MARGIN_SECONDS

#: Bits of each SQL integer type (a subclass is found before its base: BigInteger is an Integer).
_INTEGER_BITS: tuple[tuple[type[Any], int], ...] = (
    (SmallInteger, 16),
    (BigInteger, 64),
    (Integer, 32),
)

ErrorType = type[SqlqueueError]


def _base_type(column: Column[Any]) -> Any:
    """The column's declared type; a ``TypeDecorator``'s underlying type. A type's variants
    (``with_variant``) spell the same range for one backend (SQLite's 64-bit ``INTEGER`` key
    for a ``BIGINT``), so the declared type is the one that counts."""
    type_ = column.type
    while isinstance(type_, TypeDecorator):
        type_ = type_.impl_instance
    return type_


def text_length(column: Column[Any]) -> int | None:
    """The most characters ``column`` holds (``None``: unbounded text)."""
    type_ = _base_type(column)
    if not isinstance(type_, String):
        raise TypeError(f"{column} is not a text column")
    length: int | None = type_.length
    return length


def integer_range(column: Column[Any]) -> tuple[int, int]:
    """The lowest and highest value ``column``'s integer type stores."""
    type_ = _base_type(column)
    for kind, bits in _INTEGER_BITS:
        if isinstance(type_, kind):
            return -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    raise TypeError(f"{column} is not an integer column")


def check_text(
    field: str,
    value: object,
    column: Column[Any],
    error: ErrorType,
    *,
    empty: bool = False,
) -> str:
    """``value`` if it is a string ``column`` can store and compare exactly: at most its length,
    no NUL, valid Unicode, and not empty unless ``empty``; otherwise ``error`` naming ``field``."""
    if not isinstance(value, str):
        raise error(f"{field} must be a string, got {type(value).__name__} {value!r:.80}")
    if not value and not empty:
        raise error(f"{field} must not be empty")
    length = text_length(column)
    if length is not None and len(value) > length:
        raise error(
            f"{field} is {len(value)} characters long; at most {length} fit in column "
            f"{column.table.name}.{column.name}"
        )
    if "\x00" in value:
        raise error(
            f"{field} contains a NUL character (\\x00) at position {value.index(chr(0))}: "
            "databases cannot store it in text (PostgreSQL refuses it)"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as bad:
        raise error(
            f"{field} is not valid Unicode: a lone surrogate {value[bad.start]!r} at position "
            f"{bad.start} cannot be stored as UTF-8"
        ) from None
    return value


def check_integer(
    field: str,
    value: object,
    column: Column[Any],
    error: ErrorType,
    *,
    low: int | None = None,
    high: int | None = None,
) -> int:
    """``value`` if it is an ``int`` (not a ``bool``, not a float) within ``column``'s range,
    narrowed by ``low``/``high`` where the field means less; otherwise ``error``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{field} must be an integer, got {type(value).__name__} {value!r:.80}")
    lowest, highest = integer_range(column)
    if low is not None and low > lowest:
        lowest = low
    if high is not None and high < highest:
        highest = high
    if not lowest <= value <= highest:
        raise error(
            f"{field} must be between {lowest} and {highest} (column "
            f"{column.table.name}.{column.name}), got {value}"
        )
    return value


def check_ids(
    field: str, values: Iterable[object], column: Column[Any], error: ErrorType
) -> list[int]:
    """Job (or batch) ids as ``check_integer`` takes them, from a list of ints or digit strings."""
    if isinstance(values, str | bytes):
        raise error(f"{field} must be a list of ids, got {type(values).__name__} {values!r:.80}")
    ids: list[int] = []
    for value in values:
        if isinstance(value, str) and value.isascii() and value.isdigit():
            value = int(value)
        ids.append(check_integer(field, value, column, error, low=0))
    return ids


def moment_range(column: Column[Any]) -> tuple[datetime, datetime]:
    """The earliest and latest instant ``column`` holds on every supported backend."""
    if not isinstance(_base_type(column), DateTime):
        raise TypeError(f"{column} is not a timestamp column")
    return EARLIEST, LATEST


def check_moment(field: str, value: object, column: Column[Any], error: ErrorType) -> datetime:
    """``value`` if it is a timezone-aware datetime ``column`` stores on every backend (see
    :func:`moment_range`); otherwise ``error``."""
    earliest, latest = moment_range(column)
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise error(f"{field} must be a timezone-aware datetime, got {value!r:.80}")
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        utc = None
    if utc is None or not earliest <= utc <= latest:
        raise error(
            f"{field} must be between {earliest.isoformat()} and {latest.isoformat()}, "
            f"the times every supported database stores; got {value.isoformat()}"
        )
    return value


def check_delay(field: str, value: object, column: Column[Any], error: ErrorType) -> float:
    """``value`` seconds, if a number >= 0 whose run time (from now) ``column`` stores on every
    backend (see :func:`sqlqueue._moments.delay_problem`)."""
    problem = delay_problem(field, value, moment_range(column)[1])
    if problem is not None:
        raise error(problem)
    assert isinstance(value, int | float)
    return float(value)


def check_age(field: str, value: object, column: Column[Any], error: ErrorType) -> float:
    """``value`` seconds, if a number >= 0 whose time before now ``column`` stores on every
    backend (an operator's "older than")."""
    earliest = moment_range(column)[0]
    if isinstance(value, bool) or not isinstance(value, int | float):
        kind = type(value).__name__
        raise error(f"{field} must be a number of seconds, got {kind} {value!r:.80}")
    seconds = float(value)
    if math.isnan(seconds) or seconds < 0:
        raise error(f"{field} must be >= 0 seconds, got {value!r}")
    room = (datetime.now(UTC) - earliest).total_seconds() - _CLOCK_MARGIN_SECONDS
    if seconds > room:
        raise error(
            f"{field}={value!r} seconds reaches before {earliest.isoformat()}, the earliest "
            f"time every supported database stores (at most {room:.0f} seconds)"
        )
    return seconds


#: Priorities sqlqueue accepts (lower runs first): far inside the column's range, so that
#: arithmetic on them never nears it.
MAX_PRIORITY = 1_000_000


#: The limits an enqueue checks, read from the schema once (enqueue_many checks thousands of
#: jobs per call: a plain value within them passes a couple of comparisons, and only a value
#: that fails one goes through the full check, which names the field and the limit).
_JOB_TYPE_LENGTH = text_length(jobs.c.job_type) or 0
_QUEUE_LENGTH = text_length(jobs.c.queue) or 0
_KEY_LENGTH = text_length(jobs.c.idempotency_key) or 0
_GROUP_LENGTH = text_length(jobs.c.group_key) or 0
_PRIORITY_LOW = max(integer_range(jobs.c.priority)[0], -MAX_PRIORITY)
_PRIORITY_HIGH = min(integer_range(jobs.c.priority)[1], MAX_PRIORITY)
_ATTEMPTS_HIGH = integer_range(jobs.c.max_attempts)[1]
_SURELY_STORABLE_DELAY = SURELY_STORABLE_DELAY


def _plain_text(value: object, length: int) -> bool:
    """Whether ``value`` is ASCII text of 1 to ``length`` characters without NUL: surely fine."""
    return (
        type(value) is str and 0 < len(value) <= length and value.isascii() and "\x00" not in value
    )


def check_enqueue(
    job_type: object,
    idempotency_key: object,
    group_key: object,
    delay: object,
    run_at: object,
    priority: object,
    queue: object,
    max_attempts: object,
) -> float:
    """Hold one enqueue's own values to their columns (``None``: the task's or queue's
    default, checked when that was declared); raise ``EnqueueError`` naming the field. Returns
    the delay in seconds (0 without one)."""
    if not _plain_text(job_type, _JOB_TYPE_LENGTH):
        check_text("job_type", job_type, jobs.c.job_type, EnqueueError)
    if idempotency_key is not None and not _plain_text(idempotency_key, _KEY_LENGTH):
        check_text("idempotency_key", idempotency_key, jobs.c.idempotency_key, EnqueueError)
    if group_key is not None and not _plain_text(group_key, _GROUP_LENGTH):
        check_text("group_key", group_key, jobs.c.group_key, EnqueueError)
    if queue is not None and queue != "" and not _plain_text(queue, _QUEUE_LENGTH):
        check_text("queue", queue, jobs.c.queue, EnqueueError)
    if priority is not None and not (
        type(priority) is int and _PRIORITY_LOW <= priority <= _PRIORITY_HIGH
    ):
        check_integer(
            "priority",
            priority,
            jobs.c.priority,
            EnqueueError,
            low=-MAX_PRIORITY,
            high=MAX_PRIORITY,
        )
    if max_attempts is not None and not (
        type(max_attempts) is int and 1 <= max_attempts <= _ATTEMPTS_HIGH
    ):
        check_integer("max_attempts", max_attempts, jobs.c.max_attempts, EnqueueError, low=1)
    if run_at is None and delay is None:
        return 0.0
    if delay is not None and run_at is not None:
        raise EnqueueError("give either delay or run_at, not both")
    if run_at is not None:
        check_moment("run_at", run_at, jobs.c.next_run_at, EnqueueError)
        return 0.0
    # (NaN fails the comparison, as a bool fails the type test: the full check names them.)
    if (type(delay) is float or type(delay) is int) and 0 <= delay <= _SURELY_STORABLE_DELAY:
        return float(delay)
    return check_delay("delay", delay, jobs.c.next_run_at, EnqueueError)


def check_declaration(name: object, queue: object, priority: object, max_attempts: object) -> None:
    """Hold a task's (or a queue's default) name, queue, priority and attempts to the columns
    its jobs are written into; raise ``ConfigurationError`` naming the field."""
    check_text("task name", name, jobs.c.job_type, ConfigurationError)
    check_text("queue", queue, jobs.c.queue, ConfigurationError)
    check_integer(
        "priority",
        priority,
        jobs.c.priority,
        ConfigurationError,
        low=-MAX_PRIORITY,
        high=MAX_PRIORITY,
    )
    check_integer("max_attempts", max_attempts, jobs.c.max_attempts, ConfigurationError, low=1)


def check_filter(
    *,
    job_type: object = None,
    queue: object = None,
    group_key: object = None,
    error_contains: object = None,
    since: object = None,
    until: object = None,
    job_ids: Iterable[object] | None = None,
    before_id: object = None,
) -> list[int] | None:
    """Hold an operator's filter to the columns it compares with (``None``: no filter); raise
    ``ConfigurationError`` naming the field. Returns the job ids as ints."""
    for field, value, column in (
        ("job_type", job_type, jobs.c.job_type),
        ("queue", queue, jobs.c.queue),
        ("group_key", group_key, jobs.c.group_key),
    ):
        if value is not None:
            check_text(field, value, column, ConfigurationError)
    if error_contains is not None:
        check_text(
            "error_contains", error_contains, jobs.c.last_error, ConfigurationError, empty=True
        )
    for field, moment in (("since", since), ("until", until)):
        if moment is not None:
            check_moment(field, moment, jobs.c.updated_at, ConfigurationError)
    if before_id is not None:
        check_integer("before_id", before_id, jobs.c.id, ConfigurationError, low=0)
    if job_ids is None:
        return None
    return check_ids("job_ids", job_ids, jobs.c.id, ConfigurationError)


#: The columns that record who acted and why, per operator action.
_ACTION_COLUMNS: dict[str, tuple[Column[Any], Column[Any]]] = {
    "requeue": (jobs.c.requeued_by, jobs.c.requeue_reason),
    "discard": (jobs.c.discarded_by, jobs.c.discard_reason),
    "pause": (queues.c.paused_by, queues.c.pause_reason),
    "cancel": (job_actions.c.by, job_actions.c.reason),
    "run_now": (job_actions.c.by, job_actions.c.reason),
    "reschedule": (job_actions.c.by, job_actions.c.reason),
}


def check_action(action: str, by: object, reason: object) -> None:
    """Hold who acted and why to the columns that record them for ``action`` (``requeue``,
    ``discard``, ``pause``, ``cancel``, ``run_now``, ``reschedule``, or one of them
    ``_where``); raise ``ConfigurationError``."""
    if not by or not reason:
        raise ConfigurationError(f"{action} needs by= (who) and reason= (why)")
    by_column, reason_column = _ACTION_COLUMNS[action.removesuffix("_where")]
    check_text(f"{action}: by", by, by_column, ConfigurationError)
    check_text(f"{action}: reason", reason, reason_column, ConfigurationError)


def check_queue_name(field: str, name: object) -> str:
    """A queue name an operator pauses or resumes, held to ``sqlqueue_queues.name``."""
    return check_text(field, name, queues.c.name, ConfigurationError)
