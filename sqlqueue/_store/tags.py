"""Job tags in ``sqlqueue_job_tags``: written with their jobs, read for a job's page, and the
condition that finds the jobs with a tag (a range of the (tag, job id) key on every backend)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sqlalchemy import Connection, bindparam, select
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._schema import job_tags, jobs
from sqlqueue.dialects import Dialect

__all__ = ["read_tags", "tagged", "write_tags"]

#: Job ids per lookup of tags (well within every backend's bound-value limit).
_IDS_PER_LOOKUP = 1000


def write_tags(dialect: Dialect, conn: Connection, pairs: Sequence[tuple[int, str]]) -> None:
    """Tag job ``id`` with ``tag`` for each pair, in the caller's transaction; a pair already
    there (a second enqueue that an idempotency key returned the same job for) is left alone."""
    if not pairs:
        return
    conn.execute(
        dialect.conflict_insert(job_tags).on_conflict_do_nothing(
            index_elements=[job_tags.c.tag, job_tags.c.job_id]
        ),
        [{"tag": tag, "job_id": job_id} for job_id, tag in pairs],
        execution_options=dialect.table_options,
    )


def read_tags(conn: Connection, job_ids: Iterable[int]) -> dict[int, tuple[str, ...]]:
    """The tags of each of ``job_ids`` that has any, sorted."""
    ids = list(job_ids)
    found: dict[int, list[str]] = {}
    query = (
        select(job_tags.c.job_id, job_tags.c.tag)
        .where(job_tags.c.job_id.in_(bindparam("ids", expanding=True)))
        .order_by(job_tags.c.job_id, job_tags.c.tag)
    )
    for start in range(0, len(ids), _IDS_PER_LOOKUP):
        for job_id, tag in conn.execute(query, {"ids": ids[start : start + _IDS_PER_LOOKUP]}):
            found.setdefault(int(job_id), []).append(str(tag))
    return {job_id: tuple(tags) for job_id, tags in found.items()}


def tagged(tag: str) -> ColumnElement[bool]:
    """Jobs that have ``tag``."""
    return jobs.c.id.in_(select(job_tags.c.job_id).where(job_tags.c.tag == tag))


def copy_tags(dialect: Dialect, conn: Connection, moves: Sequence[tuple[int, int]]) -> None:
    """Give each new job of ``(old, new)`` the tags of the old one (a requeued dead job keeps
    what an operator filters it by)."""
    found = read_tags(conn, [old for old, _ in moves])
    write_tags(dialect, conn, [(new, tag) for old, new in moves for tag in found.get(old, ())])
