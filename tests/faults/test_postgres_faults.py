"""4. PostgreSQL faults: worker connections terminated at random while draining, a connection
killed right before a completion's COMMIT, the LISTEN connections killed (wake-ups recover, not
just polling), and the database refusing connections for a while (the closest this suite may
come to a server restart) -> lost = 0, workers stay alive and resume; figures for how soon.

Worker processes name their connections ``fault-worker-PID`` (``application_name``), so the
test terminates exactly their backends, knows whose they were, and never hits the ledger's.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import threading
import time

import pytest
import sqlalchemy as sa

import sqlqueue
from tests.apps.fault_clock import wall_clock
from tests.apps.fault_ledger import read_events
from tests.conftest import POSTGRES_URL
from tests.faults._harness import Faults, history_problems, percentile, poll, tally

pytestmark = pytest.mark.timeout(900)

NAMED = {"FAULT_APPLICATION_NAME": "fault-worker"}


def _own_queues(faults: Faults, workers: int, jobs: int, **options: object) -> list[int]:
    """Start ``workers`` workers, each serving a queue of its own, and give each queue
    ``jobs / workers`` jobs of 50 ms: every worker has work of its own to resume."""
    pool = [
        faults.start(concurrency=4, env=NAMED, queues=[f"q{n}"], **options)  # type: ignore[arg-type]
        for n in range(workers)
    ]
    faults.wait_ready(pool)
    requests = [
        sqlqueue.JobRequest(
            job_type="fault.sleep", payload={"seconds": 0.05}, queue=f"q{n % workers}"
        )
        for n in range(jobs)
    ]
    return faults.enqueue_requests(requests)


def _worker_backends(conn: sa.Connection) -> list[tuple[int, int]]:
    """``(backend pid, worker pid)`` of the worker connections to this database."""
    rows = conn.execute(
        sa.text(
            "SELECT pid, application_name FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE 'fault-worker-%'"
        )
    ).all()
    return [(int(pid), int(name.rsplit("-", 1)[1])) for pid, name in rows]


def _resume_times(faults: Faults, kills: list[tuple[float, int]]) -> list[float]:
    """Seconds from each kill to its worker's next handler start (kills after a worker's
    last start found its queue empty: nothing was left to resume)."""
    starts: dict[int, list[float]] = {}
    for execution in faults.ledger():
        starts.setdefault(execution.pid, []).append(execution.started)
    return [
        min(s for s in starts[pid] if s > at) - at
        for at, pid in kills
        if any(s > at for s in starts.get(pid, []))
    ]


def test_backends_terminated_at_random_while_draining(postgres_faults: Faults) -> None:
    faults = postgres_faults
    jobs = 300 * faults.size
    ids = _own_queues(faults, 3, jobs, lease=3.0)
    pool = faults.workers
    kills: list[tuple[float, int]] = []
    done = threading.Event()
    rng = random.Random()

    def terminate_at_random() -> None:
        admin = sa.create_engine(faults.backend.url, poolclass=sa.pool.NullPool)
        try:
            # Every 0.05-0.2 s: the workers drain the CI-sized backlog in under 2 s now, and
            # 0.1-0.4 s once left only 4 kills, short of the 5 the test needs to mean something.
            while not done.wait(rng.uniform(0.05, 0.2)):
                with admin.connect() as conn:
                    backends = _worker_backends(conn)
                    if backends:
                        backend_pid, worker_pid = rng.choice(backends)
                        conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": backend_pid})
                        kills.append((wall_clock(), worker_pid))
        finally:
            admin.dispose()

    killer = threading.Thread(target=terminate_at_random, daemon=True)
    began = time.monotonic()
    killer.start()
    try:
        faults.wait_for(jobs, "succeeded", timeout=120 + jobs / 10)
    finally:
        done.set()
        killer.join(10)
    took = time.monotonic() - began
    alive = [worker.alive for worker in pool]
    faults.stop_all()

    counted = tally(ids, faults.ledger())
    resumed = _resume_times(faults, kills)
    faults.figure(
        f"{jobs} jobs, 3 workers, {len(kills)} backends terminated at random while "
        f"draining: {counted.line()}; workers alive {sum(alive)}/3; resumed after a kill "
        f"p50 {percentile(resumed, 0.5):.2f} s, p99 {percentile(resumed, 0.99):.2f} s, max "
        f"{max(resumed or [0]):.2f} s; drained in {took:.1f} s",
        kills=len(kills),
        lost=len(counted.lost),
        duplicates=len(counted.duplicates),
        resume_p99=round(percentile(resumed, 0.99), 3),
        drain_seconds=round(took, 2),
    )
    assert all(alive), faults.explain()
    assert len(kills) >= 5, "the killer got to work"
    assert not counted.lost
    reaped = {t.job_id for t in faults.transitions() if t.new_status == "failed"}
    assert set(counted.duplicates) <= reaped, faults.describe_jobs(counted.duplicates)
    assert not history_problems(faults.transitions())
    # A dropped idle connection costs nothing; one dropped mid-statement one backoff step.
    assert percentile(resumed, 0.99) <= 5.0, sorted(resumed)[-5:]


def test_a_connection_killed_before_the_completion_commit(postgres_faults: Faults) -> None:
    faults = postgres_faults
    jobs = 20 * faults.size
    env = {**NAMED, "FAULT_KILL_BEFORE_COMMIT": "1"}
    (worker,) = faults.start_many(1, concurrency=4, env=env)
    ids = faults.enqueue("fault.noop", [{"kill_commit": n % 2 == 0} for n in range(jobs)])
    faults.wait_for(jobs, "succeeded", timeout=60 + jobs)
    alive = worker.alive
    faults.stop_all()

    kills = [
        event for event in read_events(faults.engine) if event["kind"] == "killed-before-commit"
    ]
    landed = {t.job_id: t.at for t in faults.transitions() if t.new_status == "succeeded"}
    resumed = [landed[event["job_id"]] - event["at"] for event in kills]
    counted = tally(ids, faults.ledger())
    faults.figure(
        f"{jobs} jobs, the connection killed before {len(kills)} completion commits: "
        f"{counted.line()}; completions landed on retry p50 {percentile(resumed, 0.5):.2f} s, "
        f"max {max(resumed or [0]):.2f} s after the kill; worker alive {alive}",
        kills=len(kills),
        duplicates=len(counted.duplicates),
        resume_max=round(max(resumed or [0]), 3),
    )
    assert alive, worker.describe()
    assert {event["job_id"] for event in kills} == set(ids[::2]), "every flagged commit was hit"
    assert counted.spread == (1, 1), "the killed commit rolled back; its retry did not rerun"
    assert {(j.status, j.attempts) for j in faults.jobs().values()} == {("succeeded", 1)}
    assert not history_problems(faults.transitions())
    assert max(resumed) < 5.0


def test_workers_resume_after_the_database_refused_connections(postgres_faults: Faults) -> None:
    """The database stops accepting connections and drops every worker connection for a
    while, as during a restart; the workers retry with backoff and carry on."""
    faults = postgres_faults
    outage = 3.0 if faults.size == 1 else 15.0
    jobs = 300 * faults.size
    ids = _own_queues(faults, 3, jobs, lease=5.0)
    pool = faults.workers
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    database = sa.make_url(faults.backend.url).database
    quoted = f'"{database}"'
    _mid_drain(faults, jobs)
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS false")
            dropped = conn.execute(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = :db AND application_name LIKE 'fault-worker-%'"
                ),
                {"db": database},
            ).scalar_one()
        down_at = wall_clock()
        time.sleep(outage)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f"ALTER DATABASE {quoted} ALLOW_CONNECTIONS true")
        admin.dispose()
    up_at = wall_clock()
    faults.wait_for(jobs, "succeeded", timeout=120 + jobs / 10)
    alive = [worker.alive for worker in pool]
    faults.stop_all()

    executions = faults.ledger()
    counted = tally(ids, executions)
    resumed = [
        min(e.started for e in executions if e.pid == worker.pid and e.started > up_at) - up_at
        for worker in pool
        if any(e.pid == worker.pid and e.started > up_at for e in executions)
    ]
    rows = faults.jobs()
    reaped = {j for j, job in rows.items() if any(e.kind == "LeaseExpired" for e in job.errors)}
    # The test's own ledger cannot connect either while the database is closed: a handler
    # whose ledger write failed then fails its attempt, and the retry runs it again.
    ledger_failed = {
        j for j, job in rows.items() if any(e.kind == "OperationalError" for e in job.errors)
    }
    faults.figure(
        f"{jobs} jobs, 3 workers, {dropped} connections dropped and the database closed for "
        f"{outage:g} s: {counted.line()} (of the duplicates, leases reaped "
        f"{len(reaped & set(counted.duplicates))}, attempts failed by the test's ledger "
        f"write {len(ledger_failed & set(counted.duplicates))}); workers alive {sum(alive)}/3, "
        "resumed "
        f"{len(resumed)}/3 within {max(resumed or [0]):.2f} s of reopening (p50 "
        f"{percentile(resumed, 0.5):.2f} s); started during the outage "
        f"{sum(down_at < e.started < up_at for e in executions)}",
        lost=len(counted.lost),
        duplicates=len(counted.duplicates),
        resume_max=round(max(resumed or [0]), 3),
    )
    assert all(alive), faults.explain()
    assert dropped >= 3, "every worker lost its connection"
    assert not counted.lost
    assert set(counted.duplicates) <= reaped | ledger_failed, (
        "reruns only after a reap or a failure"
    )
    assert len(resumed) == 3, "every worker took jobs again"
    # Backoff doubles from 0.5 s (±20 %): the retry after an outage of T lands by ~1.2 T.
    assert max(resumed) <= 1.2 * outage + 2.0
    assert not history_problems(faults.transitions())


def _listeners(faults: Faults) -> dict[int, int]:
    """Worker pid -> backend pid of each worker's LISTEN connection."""
    with faults.engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT pid, application_name FROM pg_stat_activity "
                "WHERE datname = current_database() AND query ILIKE 'LISTEN%' "
                "AND application_name LIKE 'fault-worker-%'"
            )
        ).all()
    return {int(name.rsplit("-", 1)[1]): int(pid) for pid, name in rows}


def _mid_drain(faults: Faults, jobs: int) -> None:
    """Wait until the workers have drained a tenth of ``jobs``: the fault then hits them mid-run
    (on a busy machine a fixed pause could end before the first claim, or after the drain)."""
    poll(
        lambda: faults.count("succeeded") >= jobs // 10,
        timeout=60,
        what="a tenth of the jobs to succeed",
    )


def _pickups(faults: Faults, count: int) -> list[float]:
    """Enqueue ``count`` jobs one by one; seconds from each commit to its handler's start."""
    committed: dict[int, float] = {}
    for _ in range(count):
        (job_id,) = faults.enqueue("fault.noop", [{}])
        committed[job_id] = wall_clock()
        time.sleep(0.1)
    poll(
        lambda: faults.count("succeeded") >= len(faults.jobs()),
        timeout=POLL / 2,
        what="the jobs to start without waiting for a poll",
    )
    starts = {e.job_id: e.started for e in faults.ledger()}
    return [starts[job_id] - at for job_id, at in committed.items()]


#: The workers' poll interval: a pickup faster than this came from a wake-up.
POLL = 30.0


def test_killed_listen_connections_recover_their_wake_ups(postgres_faults: Faults) -> None:
    faults = postgres_faults
    pool = faults.start_many(2, concurrency=4, poll=POLL, env=NAMED)
    expected = {worker.pid for worker in pool}
    poll(lambda: set(_listeners(faults)) == expected, timeout=20, what="both to LISTEN")
    # Pickups before any kill: a figure only (a worker's first claim round may still take one).
    before = _pickups(faults, 5)
    back_in: list[float] = []
    after: list[float] = []
    for _ in range(faults.size):
        old = _listeners(faults)
        with faults.engine.connect() as conn:
            for backend_pid in old.values():
                conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": backend_pid})
        killed = time.monotonic()

        def reconnected(old: dict[int, int] = old) -> bool:
            now = _listeners(faults)
            return now.keys() == expected and not set(now.values()) & set(old.values())

        poll(reconnected, timeout=30, what="both listeners to reconnect")
        back_in.append(time.monotonic() - killed)
        after += _pickups(faults, 5)
    alive = all(worker.alive for worker in pool)
    faults.stop_all()

    counted = tally(list(faults.jobs()), faults.ledger())
    faults.figure(
        f"2 workers polling every {POLL:g} s, their LISTEN connections killed {faults.size} "
        f"time(s): listening again within {max(back_in):.2f} s (p50 "
        f"{percentile(back_in, 0.5):.2f} s); pickup before {percentile(before, 0.5) * 1000:.0f}"
        f" ms p50, after {percentile(after, 0.5) * 1000:.0f} ms p50 / "
        f"{max(after) * 1000:.0f} ms max; {counted.line()}",
        listener_back_max=round(max(back_in), 3),
        pickup_after_max=round(max(after), 3),
    )
    assert alive, faults.explain()
    # A margin of 10 s under the 30 s poll: only a wake-up starts a job that soon.
    assert max(after) < POLL / 3, "wake-ups, not the 30 s poll, started the jobs after the kills"
    assert counted.spread == (1, 1)


def _restart_postgres() -> float:
    """Restart the local PostgreSQL cluster the way CI starts it; return the seconds it took."""
    version = sorted(os.listdir("/etc/postgresql"))[-1]
    began = time.monotonic()
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return time.monotonic() - began


def test_a_server_restart(postgres_faults: Faults) -> None:
    """A full restart of the PostgreSQL server while workers drain: nothing is lost, every
    worker carries on. Soak only: a restart drops every connection to the shared server, so
    it runs where nothing else does (``pytest -m slow``)."""
    faults = postgres_faults
    if faults.size == 1:
        pytest.skip(
            "a server restart would break the other tests' connections to the shared server; "
            "it runs in the soak (pytest -m slow), and the CI-sized closed-database test "
            "stands in here"
        )
    if not os.path.isdir("/etc/postgresql") or shutil.which("pg_ctlcluster") is None:
        pytest.skip("needs a local Debian PostgreSQL cluster (pg_ctlcluster) to restart")
    jobs = 300 * faults.size
    ids = _own_queues(faults, 3, jobs, lease=5.0)
    pool = faults.workers
    _mid_drain(faults, jobs)
    down_at = wall_clock()
    restart_seconds = _restart_postgres()
    up_at = wall_clock()
    faults.backend.engine.dispose()  # the test's own pooled connections died with the server
    faults.wait_for(jobs, "succeeded", timeout=300 + jobs / 10)
    alive = [worker.alive for worker in pool]
    faults.stop_all()

    executions = faults.ledger()
    counted = tally(ids, executions)
    resumed = [
        min(e.started for e in executions if e.pid == worker.pid and e.started > up_at) - up_at
        for worker in pool
        if any(e.pid == worker.pid and e.started > up_at for e in executions)
    ]
    rows = faults.jobs()
    rerun_after_failure = {
        j
        for j, job in rows.items()
        if any(e.kind in ("LeaseExpired", "OperationalError") for e in job.errors)
    }
    faults.figure(
        f"{jobs} jobs, 3 workers, the server restarted mid-drain ({restart_seconds:.1f} s, "
        f"{up_at - down_at:.1f} s wall): {counted.line()}; workers alive {sum(alive)}/3, "
        f"resumed {len(resumed)}/3 within {max(resumed or [0]):.2f} s of the restart",
        lost=len(counted.lost),
        duplicates=len(counted.duplicates),
        resume_max=round(max(resumed or [0]), 3),
    )
    assert all(alive), faults.explain()
    assert not counted.lost
    assert set(counted.duplicates) <= rerun_after_failure, "reruns only after a reap or failure"
    assert len(resumed) == 3, "every worker took jobs again"
    assert not history_problems(faults.transitions())
