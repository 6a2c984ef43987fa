"""The checked values of one job to insert: what enqueue hands the store and the dialects."""

from __future__ import annotations

from datetime import datetime
from typing import NotRequired, TypedDict

from sqlqueue._unique import UniqueCheck

__all__ = ["JobRow"]


class JobRow(TypedDict):
    """One job ready to insert; every value has been checked, nothing needs the database.

    The keys are the INSERT's bind names: column names, plus ``_run_at`` and ``_delay``, from
    which the statement computes ``next_run_at`` on the database clock; and ``_unique``, which
    the store reads to enforce ``unique_key`` (see sqlqueue/_store/unique.py). ``payload`` is the
    payload already encoded as JSON text (encoded once, when its size was checked).
    """

    job_type: str
    queue: str
    priority: int
    payload: str
    max_attempts: int
    idempotency_key: str | None
    group_key: str | None
    #: The W3C trace context of the enqueuing code, a JSON carrier (``None``: no trace).
    trace_context: str | None
    batch_id: int | None
    #: The key a ``Concurrency``-limited task's job runs under (``None``: not limited).
    limit_key: str | None
    #: The digest of its ``Unique`` key (``None``: not unique).
    unique_key: str | None
    #: When it expires unless started (``None``: never); rows with one take the one-row path.
    expires_at: datetime | None
    _run_at: datetime | None
    _delay: float
    #: How to enforce ``unique_key`` (the statuses that block, keep or replace); not bound.
    _unique: NotRequired[UniqueCheck | None]
    #: Its checked tags, written to ``sqlqueue_job_tags`` once its id is known; not bound.
    _tags: NotRequired[tuple[str, ...]]
