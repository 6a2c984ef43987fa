"""The claim by job type: a claim that names its types reads each (queue, type) pair on its own,
in claim order, for a backend whose planner would otherwise walk past the due jobs of types
the worker does not know (SQLite, through ``ix_sqlqueue_jobs_claim_by_type``).

A worker claims only the types it has tasks for (``unknown_jobs="skip"``). With one
``job_type IN (…)`` SQLite reads the claim index ``(queue, priority, next_run_at, id)`` in
claim order and tests each row's type, so 20,000 due jobs of a type no worker knows made each
claim 6 to 8 times slower than on an empty queue. Here each pair comes out of ``(queue,
job_type, priority, next_run_at, id)`` in claim order and stops at the claim's limit; the
claim takes the first ``:claim_limit`` of all of them (at most pairs x limit rows, sorted).
A single pair is the portable claim itself, which SQLite reads through the same index.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import Integer, Update, literal_column, or_, select, union_all
from sqlalchemy.sql.elements import ColumnElement

from sqlqueue._schema import jobs
from sqlqueue.dialects._claiming import _CLAIM_LIMIT, Claiming

__all__ = ["MAX_CLAIM_PAIRS", "ClaimingByType"]

#: The most (queue, job type) pairs a claim reads one by one; a worker with more reads them
#: as the portable claim does (and walks past the unknown types' due jobs again). Each pair is
#: one more index search in every claim, whether or not it has due jobs: about 12 µs on SQLite
#: here, the price of walking past some 35 due jobs of unknown types (an idle claim of 32
#: pairs took 0.54 ms, the portable one 0.19 ms). SQLite refuses a compound SELECT of more than
#: 500 parts.
MAX_CLAIM_PAIRS = 32


class ClaimingByType(Claiming):
    """The claim and the due-jobs check by (queue, job type) pair, where the claim names its
    types; otherwise the portable forms. Mixed in before ``Dialect``."""

    def claim_statement(
        self,
        *,
        queues: Sequence[str],
        job_types: Sequence[str] | None,
        lease_seconds: float,
        now: datetime | None,
        floor: bool = False,
        limited: bool = False,
    ) -> Update:
        """Each (queue, type) pair's first ``:claim_limit`` due jobs in claim order, then the
        first ``:claim_limit`` of them all leased. The portable claim without types
        (``unknown_jobs="dead"``), for a ``limited`` claim (one type and key, read through
        its own index) and past :data:`MAX_CLAIM_PAIRS` pairs; and for one pair, which the
        portable claim reads the same way, with no sort after it."""
        pairs = _pairs(queues, job_types)
        if pairs is None or len(pairs) == 1 or limited:
            return super().claim_statement(
                queues=queues,
                job_types=job_types,
                lease_seconds=lease_seconds,
                now=now,
                floor=floor,
                limited=limited,
            )
        parts = [
            select(
                self._due_jobs(
                    queues=[queue], job_types=[job_type], limit=_CLAIM_LIMIT, now=now, floor=floor
                )
                .add_columns(jobs.c.priority, jobs.c.next_run_at)
                .subquery()
            )
            for queue, job_type in pairs
        ]
        # Each part in a subquery of its own: SQLite takes ORDER BY and LIMIT only after the
        # last part of a compound SELECT.
        due = union_all(*parts).subquery("sqlqueue_due")
        first = (
            select(due.c.id)
            .order_by(due.c.priority, due.c.next_run_at, due.c.id)
            .limit(_CLAIM_LIMIT)
        )
        return self._lease(first.scalar_subquery(), lease_seconds, now, in_subquery=True)

    def due_jobs_exist(
        self, *, queues: Sequence[str], job_types: Sequence[str] | None, now: datetime | None
    ) -> ColumnElement[bool]:
        """Each (queue, type) pair on its own, as :meth:`claim_statement` reads them. Each is
        the pair's first due id in claim order, not an ``EXISTS``: SQLite drops the ``ORDER
        BY`` of an ``EXISTS``, and its statistics then chose the claim index's walk again."""
        pairs = _pairs(queues, job_types)
        if pairs is None:
            return super().due_jobs_exist(queues=queues, job_types=job_types, now=now)
        return or_(
            *(
                self._due_jobs(
                    queues=[queue],
                    job_types=[job_type],
                    limit=literal_column("1", Integer()),
                    now=now,
                )
                .scalar_subquery()
                .is_not(None)
                for queue, job_type in pairs
            )
        )


def _pairs(queues: Sequence[str], job_types: Sequence[str] | None) -> list[tuple[str, str]] | None:
    """The (queue, job type) pairs a claim reads one by one, or ``None`` when it reads them
    as the portable claim does (no types, or too many pairs)."""
    if job_types is None or len(queues) * len(job_types) > MAX_CLAIM_PAIRS:
        return None
    return [(queue, job_type) for queue in queues for job_type in job_types]
