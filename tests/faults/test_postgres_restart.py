"""A PostgreSQL server restarted while workers drain, in the default suite: the short version
of the soak's ``test_a_server_restart``. It restarts a private cluster of its own
(``tests._support.postgres``), never the shared server the other tests use: workers survive,
nothing is lost, every worker takes jobs again after the restart.

Without PostgreSQL's server binaries the test is skipped, and fails with ``CI=true``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

import sqlqueue
from tests._support.postgres import PrivateCluster, private_cluster
from tests.apps.fault_clock import wall_clock
from tests.conftest import BACKENDS, Backend
from tests.faults._harness import Faults, history_problems, tally

pytestmark = pytest.mark.timeout(180)

WORKERS = 3
JOBS_PER_WORKER = 40


@pytest.fixture
def restartable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> Iterator[tuple[Faults, PrivateCluster]]:
    """The fault harness on a migrated database of a private cluster, and that cluster."""
    if "postgresql" not in BACKENDS:
        pytest.skip("a PostgreSQL restart; SQLQUEUE_TEST_BACKENDS leaves PostgreSQL out")
    with private_cluster() as (cluster, url):
        engine = sa.create_engine(url)
        sqlqueue.migrate(engine)
        faults = Faults(
            Backend(name="postgresql", url=url, engine=engine), tmp_path, 1, capsys, "restart"
        )
        try:
            yield faults, cluster
        finally:
            faults.close()
            engine.dispose()


def test_a_server_restart_mid_drain_loses_nothing_and_workers_resume(
    restartable: tuple[Faults, PrivateCluster],
) -> None:
    faults, cluster = restartable
    pool = [
        faults.start(concurrency=2, queues=[f"q{n}"], lease=5.0)  # a queue each: each resumes
        for n in range(WORKERS)
    ]
    faults.wait_ready(pool)
    ids = faults.enqueue_requests(
        [
            sqlqueue.JobRequest(
                job_type="fault.sleep", payload={"seconds": 0.05}, queue=f"q{n % WORKERS}"
            )
            for n in range(WORKERS * JOBS_PER_WORKER)
        ]
    )
    # Mid-drain: the first jobs have finished, most are still to come on every queue.
    faults.wait_for(WORKERS * 3, "succeeded", timeout=60, what="the drain to get going")
    down_at = wall_clock()
    restart_seconds = cluster.restart()
    up_at = wall_clock()
    faults.engine.dispose()  # the test's own pooled connections died with the server
    left = faults.count("queued", "running", "failed")

    faults.wait_for(len(ids), "succeeded", timeout=120)
    alive = [worker.alive for worker in pool]
    faults.stop_all()

    executions = faults.ledger()
    counted = tally(ids, executions)
    resumed = {e.pid for e in executions if e.started > up_at}
    rerun_after_failure = {
        job_id
        for job_id, job in faults.jobs().items()
        if any(e.kind in ("LeaseExpired", "OperationalError") for e in job.errors)
    }
    faults.figure(
        f"{len(ids)} jobs, {WORKERS} workers, a private server restarted mid-drain "
        f"({restart_seconds:.1f} s, {up_at - down_at:.1f} s wall, {left} jobs left): "
        f"{counted.line()}; workers alive {sum(alive)}/{WORKERS}, resumed "
        f"{len(resumed & {w.pid for w in pool})}/{WORKERS}",
        lost=len(counted.lost),
        duplicates=len(counted.duplicates),
    )
    assert all(alive), faults.explain()
    assert left > 0, "the drain was over before the restart: nothing was tested"
    assert not counted.lost
    assert set(counted.duplicates) <= rerun_after_failure, "reruns only after a reap or failure"
    assert {worker.pid for worker in pool} <= resumed, "every worker took jobs again"
    assert not history_problems(faults.transitions())
