"""Workflows with real worker processes: diamonds (A → B, C → D) over three workers, one of
them SIGKILLed mid-run — every step succeeds exactly once and, on the database clock, no step
starts before all its upstream steps finished, whether the steps complete in
``ctx.transaction()`` or by just returning (the worker's own completion, on PostgreSQL the
folded statement, racing on each diamond's join); and a wide fan-in whose join is released
(and runs) once. The default suite runs 60 diamonds and a 300-way fan-in; the soak
(``-m slow``, ``nox -s slow``) runs 200 and 1,000.

Workers are ``python -m sqlqueue worker tests.apps.workflow_app:queue`` children. Every count
here comes from database rows: sqlqueue's jobs, and the step's own tables.
"""

from __future__ import annotations

import signal
from collections import Counter
from typing import Any

import pytest
import sqlalchemy as sa

import sqlqueue
from sqlqueue import JobRequest, Workflow
from sqlqueue._schema import jobs
from tests.apps.processes import WorkerProcess, Workers, wait_until
from tests.apps.workflow_app import RUNS, SUCCESSES, create_tables, register_workflow_tasks
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(300)

APP = "tests.apps.workflow_app:queue"
FAST_POLL = ("--poll-interval", "0.05")
#: The killed worker's lease, so its steps come back soon. Its survivors keep the app's 30 s
#: lease (far longer than a gap in their heartbeats on a loaded machine: with a 2 s lease a
#: survivor's steps were reaped from it while it ran them, and ran twice) and reap every
#: REAP_EVERY seconds.
CRASH_LEASE = 2.0
REAP_EVERY = 0.5


@pytest.fixture
def queue(backend: Backend) -> sqlqueue.Queue:
    create_tables(backend.engine)
    queue = backend.queue()
    register_workflow_tasks(queue)
    return queue


def _step(seconds: float, job_type: str = "wf.step") -> JobRequest:
    return JobRequest(job_type=job_type, payload={"seconds": seconds})


def _pool(workers: Workers, count: int, *, doomed: bool = False) -> list[WorkerProcess]:
    """``count`` workers; with ``doomed``, the first on :data:`CRASH_LEASE` and the others
    reaping every :data:`REAP_EVERY` seconds."""
    pool = [
        workers.start(
            "--concurrency",
            "4",
            *FAST_POLL,
            app=APP,
            lease_seconds=CRASH_LEASE if doomed and n == 0 else None,
            reaper_interval=REAP_EVERY if doomed and n > 0 else None,
        )
        for n in range(count)
    ]
    for worker in pool:
        worker.wait_ready()
    return pool


def _explain(pool: list[WorkerProcess]) -> Any:
    return lambda: "\n".join(worker.describe() for worker in pool)


def _count(engine: sa.Engine, table: sa.Table) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())


def _succeeded(engine: sa.Engine, job_ids: list[int]) -> int:
    with engine.connect() as conn:
        query = sa.select(sa.func.count()).where(
            jobs.c.id.in_(job_ids), jobs.c.status == "succeeded"
        )
        return int(conn.execute(query).scalar_one())


#: Diamonds in the default suite and in the soak: 60 (240 steps) still leave the survivors
#: well over a hundred steps to take over once the killed worker has had its 20 runs.
DIAMONDS = [pytest.param(60, id="ci"), pytest.param(200, id="soak", marks=pytest.mark.slow)]
#: The fan-in's width in the default suite and in the soak: the last parts race to release
#: the join whatever the width; 300 still spread over many rounds of every worker.
FAN_IN = [pytest.param(300, id="ci"), pytest.param(1000, id="soak", marks=pytest.mark.slow)]


@pytest.mark.parametrize("diamonds", DIAMONDS)
@pytest.mark.parametrize("job_type", ["wf.step", "wf.plain"], ids=["in_transaction", "plain"])
def test_diamonds_over_3_workers_one_killed_run_each_step_once_in_order(
    backend: Backend, queue: sqlqueue.Queue, workers: Workers, job_type: str, diamonds: int
) -> None:
    """``wf.step`` records its success in ``ctx.transaction()`` (a row per success: each step
    succeeded once, the killed worker's included); ``wf.plain`` just returns, so only the
    recorded runs tell: one each for the steps the killed worker never ran."""
    handles = []
    with queue.engine.begin() as conn:
        for _ in range(diamonds):
            wf = Workflow()
            wf.add("a", _step(0.05, job_type))
            wf.add("b", _step(0.05, job_type), after=["a"])
            wf.add("c", _step(0.05, job_type), after=["a"])
            wf.add("d", _step(0.0, job_type), after=["b", "c"])
            handles.append(queue.enqueue_workflow(conn, wf))
    all_ids = [job_id for handle in handles for job_id in handle.job_ids.values()]
    pool = _pool(workers, 3, doomed=True)
    doomed = pool[0]

    def runs_of_doomed() -> int:
        with queue.engine.connect() as conn:
            query = sa.select(sa.func.count()).where(RUNS.c.pid == doomed.pid)
            return int(conn.execute(query).scalar_one())

    wait_until(lambda: runs_of_doomed() >= 20, timeout=120, what="the doomed worker's runs",
               explain=_explain(pool))  # fmt: skip
    doomed.send(signal.SIGKILL)
    assert doomed.wait(timeout=10) == -signal.SIGKILL
    assert _succeeded(queue.engine, all_ids) < len(all_ids), "all done before the kill"
    wait_until(
        lambda: _succeeded(queue.engine, all_ids) >= len(all_ids),
        timeout=240,
        what="every step to succeed",
        explain=_explain(pool[1:]),
    )
    for worker in pool[1:]:
        assert worker.stop() == 0
    with queue.engine.connect() as conn:
        successes = Counter(conn.execute(sa.select(SUCCESSES.c.job_id)).scalars())
        statuses = Counter(
            conn.execute(sa.select(jobs.c.status).where(jobs.c.id.in_(all_ids))).scalars()
        )
        finished = dict(conn.execute(sa.select(jobs.c.id, jobs.c.finished_at)).all())
        first_start: dict[int, Any] = {}
        runs: Counter[int] = Counter()
        ran_by_doomed: set[int] = set()
        for job_id, started, pid in conn.execute(
            sa.select(RUNS.c.job_id, RUNS.c.started_at, RUNS.c.pid)
        ):
            first_start[job_id] = min(started, first_start.get(job_id, started))
            runs[job_id] += 1
            if pid == doomed.pid:
                ran_by_doomed.add(job_id)
        pids = set(conn.execute(sa.select(RUNS.c.pid)).scalars())
    assert dict(statuses) == {"succeeded": 4 * diamonds}
    assert set(runs) == set(all_ids)
    if job_type == "wf.step":
        # A completion in the handler's transaction that the server aborts (a MariaDB
        # deadlock on a join) rolls the step's work back with it: the step runs again, and
        # succeeds once. Its success rows are what happened exactly once.
        assert set(successes) == set(all_ids)
        assert set(successes.values()) == {1}, "a step succeeded twice"
    else:
        assert successes == Counter()
        twice = {job_id: n for job_id, n in runs.items() if n != 1 and job_id not in ran_by_doomed}
        assert twice == {}, "a step the killed worker never ran ran more than once"
    assert len(pids) == 3
    early = []
    for handle in handles:
        ids = handle.job_ids
        for step, upstreams in (("b", "a"), ("c", "a"), ("d", "bc")):
            latest = max(finished[ids[up]] for up in upstreams)
            if first_start[ids[step]] < latest:
                early.append((handle.id, step, first_start[ids[step]], latest))
    assert early == [], f"steps started before their upstreams finished: {early[:5]}"
    for handle in handles:
        status = queue.get_workflow(handle.id)
        assert status is not None
        assert status.succeeded
        assert status.finished_at is not None


@pytest.mark.parametrize("width", FAN_IN)
def test_a_wide_fan_in_releases_its_join_once(
    backend: Backend, queue: sqlqueue.Queue, workers: Workers, width: int
) -> None:
    wf = Workflow()
    parts = [wf.add(f"p{n}", _step(0.0)) for n in range(width)]
    wf.add("join", _step(0.0), after=parts)
    with queue.engine.begin() as conn:
        handle = queue.enqueue_workflow(conn, wf)
    pool = _pool(workers, 3)
    join = handle.job_ids["join"]
    wait_until(
        lambda: _count(queue.engine, SUCCESSES) >= width + 1,
        timeout=240,
        what="the parts and the join",
        explain=_explain(pool),
    )
    for worker in pool:
        assert worker.stop() == 0
    with queue.engine.connect() as conn:
        join_runs = conn.execute(
            sa.select(sa.func.count()).where(RUNS.c.job_id == join)
        ).scalar_one()
        join_start = conn.execute(sa.select(RUNS.c.started_at).where(RUNS.c.job_id == join))
        last_part = conn.execute(
            sa.select(sa.func.max(jobs.c.finished_at)).where(jobs.c.id != join)
        ).scalar_one()
        (started,) = join_start.scalars().all()
    assert join_runs == 1
    assert _count(queue.engine, SUCCESSES) == width + 1
    assert started >= last_part
    status = queue.get_workflow(handle.id)
    assert status is not None
    assert status.succeeded
