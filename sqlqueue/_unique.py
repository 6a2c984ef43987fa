"""Unique jobs: at most one job per task and key among the jobs in some statuses.

:class:`Unique` says what makes two jobs "the same" (payload keys, or a function of the
payload, within an optional time bucket) and in which statuses an existing job blocks a new one.
:func:`unique_key` turns that into the fixed-size digest stored in ``sqlqueue_jobs.unique_key``;
the store (``sqlqueue/_store/unique.py``) lets the database decide between concurrent enqueuers.
Everything here is checked before any SQL is sent.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sqlqueue._errors import ConfigurationError, EnqueueError, PayloadError
from sqlqueue._payload import MAX_DEPTH, MAX_INT

__all__ = [
    "STATUSES",
    "Unique",
    "UniqueCheck",
    "unique_digest",
    "unique_key",
    "unique_text",
    "unique_values",
]

#: What ``Unique.states`` may name: every status a unique job can have. Not ``waiting``: only
#: a workflow step waits, and a step cannot be unique (see sqlqueue/_enqueue_workflow.py).
STATUSES = ("queued", "running", "succeeded", "failed", "dead", "cancelled")

#: How many payload keys ``by`` may name, and how long each name may be.
_MAX_BY_KEYS = 32
_MAX_KEY_NAME = 200

OnConflict = Literal["keep", "replace"]


@dataclass(frozen=True, kw_only=True)
class Unique:
    """At most one job of a task per key among the jobs whose status is in ``states``.

    ``by`` names payload keys (``("user_id",)``) or is a function of the payload returning
    any JSON value; ``period`` (seconds) makes the key hold only within one time bucket of
    that length (by the enqueuing process's clock). ``on_conflict="keep"`` returns the existing
    job's id and writes nothing; ``"replace"`` gives a still-``queued`` existing job the new
    payload and run time (a debounce), and keeps it as it is otherwise.
    """

    by: Sequence[str] | Callable[[Mapping[str, Any]], Any] = ()
    period: float | None = None
    states: Sequence[str] = ("queued", "running", "failed")
    on_conflict: OnConflict = "keep"

    def __post_init__(self) -> None:
        if not callable(self.by):
            by = (self.by,) if isinstance(self.by, str) else self.by
            if (
                not isinstance(by, Sequence)
                or isinstance(by, bytes | bytearray)  # a Sequence of ints, even when empty
                or not all(isinstance(name, str) for name in by)
            ):
                raise ConfigurationError(
                    f"Unique.by must be payload key names or a callable, got {self.by!r}"
                )
            if len(by) > _MAX_BY_KEYS or any(not 0 < len(name) <= _MAX_KEY_NAME for name in by):
                raise ConfigurationError(
                    f"Unique.by takes up to {_MAX_BY_KEYS} non-empty key names of up to "
                    f"{_MAX_KEY_NAME} characters, got {self.by!r}"
                )
            object.__setattr__(self, "by", tuple(by))
        period = self.period
        if period is not None and (
            isinstance(period, bool)
            or not isinstance(period, int | float)
            or not math.isfinite(period)
            or period <= 0
        ):
            raise ConfigurationError(f"Unique.period must be > 0 seconds or None, got {period!r}")
        states = (self.states,) if isinstance(self.states, str) else self.states
        if (
            not isinstance(states, Sequence)
            or not states
            or any(state not in STATUSES for state in states)
        ):
            raise ConfigurationError(
                f"Unique.states must name one or more of {', '.join(STATUSES)}; got {self.states!r}"
            )
        object.__setattr__(self, "states", tuple(dict.fromkeys(states)))
        if self.on_conflict not in ("keep", "replace"):
            raise ConfigurationError(
                f'Unique.on_conflict must be "keep" or "replace", got {self.on_conflict!r}'
            )


@dataclass(frozen=True)
class UniqueCheck:
    """What the store needs to enforce one row's uniqueness: the statuses that block, whether
    a waiting job is replaced, and the other keys the same job may be held under."""

    states: tuple[str, ...]
    replace: bool
    #: The job's key under the queue's older encryption keys, for a key derived from a secret
    #: field (a keyed hash, one per key): a job enqueued before a key rotation holds one.
    also: tuple[str, ...] = ()


def unique_key(
    job_type: str, unique: Unique, payload: Mapping[str, Any], now: float | None = None
) -> str:
    """The SHA-256 hex digest of the task, the ``by`` values and the period bucket of ``now``
    (Unix seconds; the current time by default). Raises :class:`~sqlqueue.EnqueueError` when
    the payload lacks a ``by`` key or the values are not JSON. (A key that depends on a secret
    field is an HMAC of the same text instead: see sqlqueue/_secret_keys.py.)"""
    return unique_digest(
        unique_text(job_type, unique, unique_values(job_type, unique, payload), now)
    )


def unique_digest(text: str) -> str:
    """The SHA-256 hex digest of a unique key's text (:func:`unique_text`)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def unique_values(job_type: str, unique: Unique, payload: Mapping[str, Any]) -> Any:
    """What makes a job of ``job_type`` "the same" as another: the ``by`` function's answer,
    or the values of the ``by`` keys, checked to be JSON that can be written."""
    if callable(unique.by):
        try:
            values: Any = unique.by(payload)
        except Exception as error:
            raise EnqueueError(
                f"the Unique.by function of {job_type!r} raised {type(error).__name__}: {error}"
            ) from error
    else:
        missing = [name for name in unique.by if name not in payload]
        if missing:
            raise EnqueueError(
                f"{job_type!r} is unique by {list(unique.by)!r} but the payload has no "
                f"{missing[0]!r} key"
            )
        values = [payload[name] for name in unique.by]
    problem = _unbounded(values, 0)
    if problem is not None:  # named here, not a RecursionError or ValueError from json
        raise PayloadError(
            f"the unique key values of {job_type!r} must be JSON (str, numbers, lists, "
            f"dicts): {problem}"
        )
    return values


def unique_text(job_type: str, unique: Unique, values: Any, now: float | None = None) -> str:
    """The canonical JSON text a unique key is the digest of: the task, ``values`` (from
    :func:`unique_values`) and the period bucket of ``now``."""
    bucket = None
    if unique.period is not None:
        bucket = math.floor((time.time() if now is None else now) / unique.period)
    try:
        return json.dumps(
            [job_type, values, bucket], sort_keys=True, separators=(",", ":"), allow_nan=False
        )
    except (TypeError, ValueError) as error:
        raise EnqueueError(
            f"the unique key values of {job_type!r} must be JSON (str, numbers, lists, "
            f"dicts): {error}"
        ) from error


def _unbounded(value: Any, depth: int) -> str | None:
    """What makes ``value`` impossible to write as JSON here (nested past
    :data:`~sqlqueue._payload.MAX_DEPTH` levels, an integer past
    :data:`~sqlqueue._payload.MAX_INT`), or ``None``. Only the digest is stored, so any text
    is fine; the rest is ``json.dumps``'s to judge."""
    if depth > MAX_DEPTH:
        return f"they are nested more than {MAX_DEPTH} levels deep"
    if isinstance(value, int) and not isinstance(value, bool):
        return None if -MAX_INT < value < MAX_INT else "an integer has over 4,300 digits"
    items: Any = (
        value.values()
        if isinstance(value, Mapping)
        else value
        if isinstance(value, list | tuple)
        else ()
    )
    for item in items:
        problem = _unbounded(item, depth + 1)
        if problem is not None:
            return problem
    return None
