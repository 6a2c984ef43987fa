"""The job filter of the list page, read from its query string (or from a bulk action's form)
into the arguments of ``Queue.jobs`` / ``requeue_where`` / ``discard_where``; a bad value is a
400 that says which parameter is wrong, never a guess."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from starlette.exceptions import HTTPException

from sqlqueue._digits import ascii_number
from sqlqueue._errors import ConfigurationError
from sqlqueue._job import JobStatus
from sqlqueue._operators.moments import parse_moment
from sqlqueue._queue import Queue
from sqlqueue._tags import check_tag

__all__ = ["MAX_JOB_ID", "JobListFilter", "job_list_filter"]

#: Job ids are 64-bit signed integers on every backend.
MAX_JOB_ID = 2**63 - 1
_MAX_TEXT = 1000


@dataclass(frozen=True, kw_only=True)
class JobListFilter:
    """The list's filters as the page spells them (``type``, ``error``, ``since`` …);
    ``unhandled``: only dead jobs nobody has requeued or discarded."""

    status: str | None = None
    job_type: str | None = None
    queue: str | None = None
    error: str | None = None
    since: str | None = None
    #: Only jobs with this tag (listing only: the bulk actions on every matching job do not
    #: take it, so a tag filter turns them off rather than act on more than is listed).
    tag: str | None = None
    unhandled: bool = False
    before_id: int | None = None

    def query(self) -> dict[str, str | None]:
        """The filters as query parameters (paging excluded), for links and hidden fields."""
        return {
            "status": self.status,
            "type": self.job_type,
            "queue": self.queue,
            "error": self.error,
            "since": self.since,
            "tag": self.tag,
            "unhandled": "1" if self.unhandled else None,
        }

    @property
    def narrows_dead(self) -> bool:
        """Whether it names which dead jobs (a bulk action refuses to take every one); never
        with a tag, which the bulk actions on every matching job do not filter by."""
        return self.tag is None and any((self.job_type, self.queue, self.error, self.since))

    def since_moment(self, queue: Queue) -> datetime | None:
        """``since`` as a time: ISO 8601, or a duration (``2h``) back from the database clock."""
        if self.since is None:
            return None
        try:
            return parse_moment(self.since, option="since", now=queue.database_now())
        except ConfigurationError as error:
            raise HTTPException(400, str(error)) from None


def _text(params: Mapping[str, object], name: str) -> str | None:
    """Parameter ``name``, stripped (blank: ``None``); 400 when too long or holding a NUL."""
    value = params.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise HTTPException(400, f"{name}: expected text")
    value = value.strip()
    if len(value) > _MAX_TEXT:
        raise HTTPException(400, f"{name}: longer than {_MAX_TEXT} characters")
    if "\x00" in value:  # no database stores it in text; PostgreSQL refuses the query
        raise HTTPException(400, f"{name}: contains a NUL character")
    return value or None


def job_list_filter(params: Mapping[str, object]) -> JobListFilter:
    """The filter in ``params``; 400 for an unknown status, a malformed ``before_id`` or
    ``unhandled``."""
    status = _text(params, "status")
    if status is not None and status not in {s.value for s in JobStatus}:
        names = ", ".join(s.value for s in JobStatus)
        raise HTTPException(400, f"status must be one of {names}; got {status!r}")
    before = _text(params, "before_id")
    before_id: int | None = None
    if before is not None:
        before_id = ascii_number(before)
        if before_id is None or not 1 <= before_id <= MAX_JOB_ID:
            raise HTTPException(400, f"before_id must be a job id, got {before!r}")
    unhandled = _text(params, "unhandled")
    if unhandled not in (None, "1"):
        raise HTTPException(
            400, f"unhandled must be 1 (dead jobs nobody has handled) or absent, got {unhandled!r}"
        )
    return JobListFilter(
        status=status,
        unhandled=unhandled == "1",
        job_type=_text(params, "type"),
        queue=_text(params, "queue"),
        error=_text(params, "error"),
        since=_text(params, "since"),
        tag=_tag(params),
        before_id=before_id,
    )


def _tag(params: Mapping[str, object]) -> str | None:
    """The ``tag`` parameter, checked as enqueue checks tags; 400 for one no job can have."""
    tag = _text(params, "tag")
    if tag is None:
        return None
    try:
        return check_tag("tag", tag, ConfigurationError)
    except ConfigurationError as error:
        raise HTTPException(400, str(error)) from None
