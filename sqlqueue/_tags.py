"""Job tags: short labels (``"tenant:42"``, ``"import"``) to find jobs by, checked before any SQL.

A task's tags and an enqueue's are merged, in order, without repeats. Each is a non-empty
string of at most the column's length without surrounding whitespace (MariaDB/MySQL compare
text padded with spaces, so ``"a "`` would be ``"a"`` there), and a job has at most
:data:`MAX_TAGS`. They live in ``sqlqueue_job_tags``, one row per job and tag, indexed by tag.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlqueue._errors import SqlqueueError
from sqlqueue._limits import ErrorType, check_text
from sqlqueue._schema import job_tags

__all__ = ["MAX_TAGS", "check_tag", "check_tags"]

#: How many tags one job may have.
MAX_TAGS = 20


def check_tag(field: str, value: object, error: ErrorType) -> str:
    """``value`` if it is a tag the table stores exactly; otherwise ``error`` naming ``field``."""
    tag = check_text(field, value, job_tags.c.tag, error)
    if tag != tag.strip():
        raise error(f"{field} {tag!r} has surrounding whitespace; tags are compared exactly")
    return tag


def check_tags(
    value: object, error: type[SqlqueueError], *, base: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """``base`` followed by the tags of ``value`` (a list of strings, or ``None``), without
    repeats; ``error`` for anything else, or for more than :data:`MAX_TAGS` in all."""
    if value is None:
        return base
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise error(
            f"tags must be a list of strings, got {type(value).__name__} {value!r:.80} "
            '(one tag is ["tag"])'
        )
    merged = dict.fromkeys(base)
    for index, item in enumerate(value):
        merged[check_tag(f"tags[{index}]", item, error)] = None
        if len(merged) > MAX_TAGS:
            raise error(f"a job has at most {MAX_TAGS} tags")
    return tuple(merged)
