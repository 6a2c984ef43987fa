"""A claim that names its job types takes them in claim order past the jobs of other types
(issue 43, item 7).

A worker claims only the types it has tasks for. Where the backend reads each (queue, type)
pair on its own (SQLite, ``sqlqueue/dialects/_claiming_by_type.py``), the claim must still
take the known types in one claim order, ``(priority, next_run_at, id)``, across types and
queues, with the same rules as the portable claim (group keys, expiry, due time, limit keys);
jobs of other types stay as they were. Every backend runs these; the last tests hold SQLite's
plan to the index that makes the claim fast behind a backlog of unknown types.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue._schema import jobs
from sqlqueue.dialects import dialect_for
from tests._support import db_now
from tests.conftest import Backend, migrated_url

pytestmark = pytest.mark.timeout(120)

KNOWN = ("typed.a", "typed.b", "typed.c")
UNKNOWN = "typed.unknown"


def _put(
    queue: sqlqueue.Queue,
    job_type: str,
    *,
    priority: int,
    due_ago: int,
    name: str = "default",
    **options: Any,
) -> int:
    """A job of ``job_type`` in queue ``name``, due ``due_ago`` seconds ago by the database
    clock (negative: not due yet)."""
    with queue.engine.begin() as conn:
        job_id = queue.enqueue(
            conn, job_type, priority=priority, queue=name, external=True, **options
        )
        due = db_now(queue.engine) - timedelta(seconds=due_ago)
        conn.execute(sa.update(jobs).where(jobs.c.id == job_id).values(next_run_at=due))
    return job_id


def _claim(queue: sqlqueue.Queue, limit: int, queues: Sequence[str] = ("default",)) -> list[int]:
    """The ids one claim of the known types takes, in claim order."""
    claimed = queue.store.claim(
        queues=list(queues),
        job_types=sorted(KNOWN),
        limit=limit,
        worker_id="claim-by-type",
        lease_seconds=600,
    )
    return [job.id for job in claimed]


def _claim_order(queue: sqlqueue.Queue, job_ids: Sequence[int]) -> list[int]:
    """``job_ids`` sorted as the portable claim orders them, read from their rows."""
    with queue.engine.connect() as conn:
        rows = conn.execute(
            sa.select(jobs.c.id)
            .where(jobs.c.id.in_(job_ids))
            .order_by(jobs.c.priority, jobs.c.next_run_at, jobs.c.id)
        )
        return list(rows.scalars())


def _untouched(queue: sqlqueue.Queue, job_ids: Sequence[int]) -> None:
    with queue.engine.connect() as conn:
        rows = conn.execute(
            sa.select(jobs.c.status, jobs.c.attempts, jobs.c.locked_by).where(
                jobs.c.id.in_(job_ids)
            )
        ).all()
    assert sorted(tuple(row) for row in rows) == [("queued", 0, None)] * len(job_ids)


def _claims_one_by_one(queue: sqlqueue.Queue, queues: Sequence[str]) -> list[int]:
    taken: list[int] = []
    while claimed := _claim(queue, 1, queues):
        taken.extend(claimed)
        assert len(taken) < 100, "the claims never ran dry"
    return taken


def test_the_known_types_come_in_claim_order_past_the_unknown_ones(backend: Backend) -> None:
    queue = backend.queue()
    unknown = [_put(queue, UNKNOWN, priority=-5, due_ago=300 - n) for n in range(5)]
    # Three types, their priorities and due times interleaved; ties broken by id.
    known = [
        _put(queue, "typed.a", priority=0, due_ago=30),
        _put(queue, "typed.b", priority=0, due_ago=60),
        _put(queue, "typed.c", priority=0, due_ago=45),
        _put(queue, "typed.a", priority=-1, due_ago=10),
        _put(queue, "typed.c", priority=1, due_ago=100),
        _put(queue, "typed.b", priority=-1, due_ago=10),
        _put(queue, "typed.a", priority=-1, due_ago=10),
        _put(queue, "typed.b", priority=2, due_ago=200),
        _put(queue, "typed.c", priority=-1, due_ago=50),
    ]
    unknown.append(_put(queue, UNKNOWN, priority=0, due_ago=40))  # between the known ones
    expected = _claim_order(queue, known)
    # Not claimed by anyone: due later, expired, behind an older job of its group.
    later = _put(queue, "typed.a", priority=-9, due_ago=-3600)
    expired = _put(queue, "typed.b", priority=-9, due_ago=5, expires_in=3600)
    with backend.engine.begin() as conn:
        conn.execute(
            sa.update(jobs)
            .where(jobs.c.id == expired)
            .values(expires_at=db_now(backend.engine) - timedelta(seconds=1))
        )
    unknown.append(_put(queue, UNKNOWN, priority=5, due_ago=900, group_key="order:7"))
    grouped = _put(queue, "typed.c", priority=-9, due_ago=900, group_key="order:7")

    first = _claim(queue, 4)
    assert sorted(first) == sorted(expected[:4])  # the limit spans the types
    assert _claims_one_by_one(queue, ["default"]) == expected[4:]
    _untouched(queue, [*unknown, later, expired, grouped])


def test_two_queues_share_one_claim_order(backend: Backend) -> None:
    queue = backend.queue()
    unknown = [
        _put(queue, UNKNOWN, priority=-5, due_ago=100, name=name)
        for name in ("mail", "reports")
        for _ in range(3)
    ]
    known = [
        _put(queue, "typed.a", priority=1, due_ago=10, name="mail"),
        _put(queue, "typed.b", priority=0, due_ago=20, name="reports"),
        _put(queue, "typed.a", priority=0, due_ago=30, name="reports"),
        _put(queue, "typed.c", priority=0, due_ago=5, name="mail"),
        _put(queue, "typed.b", priority=-1, due_ago=1, name="mail"),
        _put(queue, "typed.c", priority=1, due_ago=50, name="reports"),
    ]
    elsewhere = _put(queue, "typed.a", priority=-9, due_ago=100, name="other")
    expected = _claim_order(queue, known)

    first = _claim(queue, 3, ["mail", "reports"])
    assert sorted(first) == sorted(expected[:3])
    assert _claims_one_by_one(queue, ["mail", "reports"]) == expected[3:]
    _untouched(queue, [*unknown, elsewhere])


def test_jobs_with_a_limit_key_stay_out_of_the_plain_claim(backend: Backend) -> None:
    queue = backend.queue()
    queue.task("typed.a", concurrency=sqlqueue.Concurrency(limit=1))(lambda: None)
    with queue.engine.begin() as conn:
        held = queue.enqueue(conn, "typed.a")
    plain = _put(queue, "typed.b", priority=0, due_ago=5)
    assert _claim(queue, 10) == [plain]
    with queue.engine.connect() as conn:
        status = conn.execute(sa.select(jobs.c.status).where(jobs.c.id == held)).scalar_one()
    assert status == "queued"


def _due(backend: Backend, queues: Sequence[str]) -> bool:
    """What ``Dialect.due_jobs_exist`` says for the known types in ``queues`` now."""
    condition = dialect_for(backend.engine).due_jobs_exist(
        queues=list(queues), job_types=sorted(KNOWN), now=None
    )
    with backend.engine.connect() as conn:
        return bool(conn.execute(sa.select(condition)).scalar_one())


def test_due_jobs_exist_looks_at_the_known_types_only(backend: Backend) -> None:
    queue = backend.queue()
    _put(queue, UNKNOWN, priority=0, due_ago=60)
    _put(queue, "typed.b", priority=0, due_ago=-3600)  # not due yet
    _put(queue, "typed.c", priority=0, due_ago=60, name="other")
    assert not _due(backend, ["default"])
    assert _due(backend, ["default", "other"])
    _put(queue, "typed.a", priority=3, due_ago=1)
    assert _due(backend, ["default"])


# -- SQLite's plan ---------------------------------------------------------------------------


@pytest.fixture
def sqlite_queue(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """A migrated SQLite file behind 2,000 due jobs of an unknown type in each of two queues,
    analysed (the statistics that made SQLite walk the claim index before)."""
    queue = sqlqueue.Queue(migrated_url(request, "sqlite", tmp_path))
    backlog = [
        sqlqueue.JobRequest(job_type=UNKNOWN, queue=name, payload={}, external=True)
        for name in ("mail", "reports")
        for _ in range(2000)
    ]
    with queue.engine.begin() as conn:
        queue.enqueue_many(conn, backlog)
        queue.enqueue(conn, "typed.a", queue="mail", external=True)
        conn.exec_driver_sql("ANALYZE")
    yield queue
    queue.engine.dispose()


def _plan(queue: sqlqueue.Queue, statement: Any) -> list[tuple[int, int, str]]:
    """SQLite's ``EXPLAIN QUERY PLAN`` of ``statement`` as a claim runs it: (id, parent,
    detail) rows."""
    compiled = statement.compile(queue.engine)
    params = {
        **compiled.params,
        "claim_limit": 10,
        "worker_id": "plan",
        "lease_seconds": 30.0,
        "claim_ahead": False,
    }
    values = tuple(params[name] for name in compiled.positiontup)
    with queue.engine.connect() as conn:
        rows = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {compiled}", values).all()
    return [(int(row[0]), int(row[1]), str(row[3])) for row in rows]


BY_TYPE = "SEARCH sqlqueue_jobs USING INDEX ix_sqlqueue_jobs_claim_by_type (queue=? AND job_type=?)"


def _reads_of_jobs(plan: list[tuple[int, int, str]]) -> list[str]:
    """How the plan reads ``sqlqueue_jobs`` itself (not the group check's alias, not the
    lease's lookup by id)."""
    return [
        detail
        for _, _, detail in plan
        if " sqlqueue_jobs " in f"{detail} " and "PRIMARY KEY" not in detail
    ]


def _sorts_inside_a_part(plan: list[tuple[int, int, str]]) -> list[str]:
    """The sorts under one pair's subquery (a part must come out of the index in order)."""
    nodes = {node: (parent, detail) for node, parent, detail in plan}
    found = []
    for node, _, detail in plan:
        if "TEMP B-TREE" not in detail:
            continue
        parent = nodes[node][0]
        while parent in nodes:
            above, what = nodes[parent]
            if what.startswith("CO-ROUTINE anon_"):
                found.append(f"{detail} under {what}")
            parent = above
    return found


@pytest.mark.parametrize(
    ("queues", "job_types"),
    [(["mail"], ["typed.a"]), (["mail", "reports"], ["typed.a", "typed.b", "typed.c"])],
)
def test_sqlite_claims_each_queue_and_type_through_its_index(
    sqlite_queue: sqlqueue.Queue, queues: list[str], job_types: list[str]
) -> None:
    dialect = sqlite_queue.dialect
    claim = dialect.claim_statement(queues=queues, job_types=job_types, lease_seconds=30, now=None)
    plan = _plan(sqlite_queue, claim)
    assert _reads_of_jobs(plan) == [BY_TYPE] * (len(queues) * len(job_types)), plan
    assert _sorts_inside_a_part(plan) == [], plan
    if len(queues) * len(job_types) == 1:  # the pair's own order: nothing to sort
        assert not [detail for _, _, detail in plan if "TEMP B-TREE" in detail], plan
    due = sa.select(dialect.due_jobs_exist(queues=queues, job_types=job_types, now=None))
    plan = _plan(sqlite_queue, due)
    assert _reads_of_jobs(plan) == [BY_TYPE] * (len(queues) * len(job_types)), plan


def test_sqlite_claim_takes_the_known_job_behind_the_backlog(
    sqlite_queue: sqlqueue.Queue,
) -> None:
    claimed = sqlite_queue.store.claim(
        queues=["mail", "reports"],
        job_types=list(KNOWN),
        limit=10,
        worker_id="plan",
        lease_seconds=30,
    )
    assert [job.job_type for job in claimed] == ["typed.a"]
