"""A worker's round trip (``Store.cycle``): finished attempts' outcomes and the next claims in one
transaction, on every backend."""

from __future__ import annotations

from datetime import timedelta

import pytest

import sqlqueue
from sqlqueue._store.rows import Failure
from sqlqueue._store.transactions import in_write


def _queue_with_jobs(backend):
    queue = backend.queue(lease_seconds=30)

    @queue.task("work")
    def work() -> None:
        pass

    with backend.engine.begin() as conn:
        grouped = [work.options(group_key="g").enqueue(conn) for _ in range(2)]
        plain = [work.enqueue(conn) for _ in range(3)]
    return queue, grouped, plain


def _cycle(queue, worker_id, *, succeeded=(), failures=(), limit=10):
    return queue.store.cycle(
        worker_id=worker_id,
        succeeded=list(succeeded),
        failures=list(failures),
        results=None,
        claims=[(("default",), limit)],
        job_types=None,
        lease_seconds=30,
    )


def test_a_cycle_claims_up_to_its_limit_most_urgent_first(backend):
    queue, grouped, plain = _queue_with_jobs(backend)
    landed, [claimed] = _cycle(queue, "w1", limit=3)
    assert landed == set()
    assert [job.id for job in claimed] == [grouped[0], *plain[:2]]  # the group's second waits
    assert {queue.get_job(job.id).locked_by for job in claimed} == {"w1"}


def test_outcomes_land_first_so_a_finished_group_job_frees_the_next_in_the_same_cycle(backend):
    queue, grouped, _plain = _queue_with_jobs(backend)
    _, [first] = _cycle(queue, "w1")
    assert grouped[1] not in {job.id for job in first}
    done = next(job for job in first if job.id == grouped[0])
    landed, [second] = _cycle(queue, "w1", succeeded=[done.fence])
    assert landed == {grouped[0]}
    assert [job.id for job in second] == [grouped[1]]
    assert queue.get_job(grouped[0]).status == "succeeded"


def test_a_stale_outcome_does_not_land_and_does_not_stop_the_claims(backend):
    queue, _grouped, plain = _queue_with_jobs(backend)
    _, [claimed] = _cycle(queue, "w1", limit=1)
    job = claimed[0]
    failure = Failure(
        job_id=job.id,
        attempt=job.attempt,
        dead=False,
        retry_in=60.0,
        last_error="boom",
        errors=[],
    )
    landed, [more] = _cycle(queue, "w2", succeeded=[(plain[0], 1)], failures=[failure], limit=2)
    assert landed == set()  # neither lease belongs to w2 (plain[0] is not even claimed)
    assert [j.id for j in more] == plain[:2]
    assert queue.get_job(job.id).status == "running"  # w1's lease is untouched
    landed, _ = _cycle(queue, "w1", failures=[failure], limit=0)
    assert landed == {job.id}
    assert queue.get_job(job.id).status == "failed"


def test_a_claimed_job_carries_exactly_what_its_row_holds(backend):
    """SQLite reads a claim's JSON and timestamps from their stored text (each distinct
    timestamp parsed once): the jobs must still equal what the row reads back as."""
    queue = backend.queue(lease_seconds=30)

    @queue.task("work")
    def work(**_payload: object) -> None:
        pass

    payload = {"name": "Zoë ✓", "ids": [1, 2, 3], "nested": {"ok": True, "none": None, "f": 1.5}}
    with backend.engine.begin() as conn:
        first = queue.enqueue(conn, "work", payload)
        second = queue.enqueue(conn, "work", {})
    _, [claimed] = _cycle(queue, "w1", limit=1)
    [job] = claimed
    failure = Failure(
        job_id=job.id,
        attempt=job.attempt,
        dead=False,
        retry_in=0.0,
        last_error="boom",
        errors=[{"attempt": 1, "at": job.started_at.isoformat(), "error": "boom", "kind": "E"}],
    )
    _, [again] = _cycle(queue, "w1", failures=[failure], limit=2)
    by_id = {job.id: job for job in again}
    assert set(by_id) == {first, second}
    for job_id in (first, second):
        job, row = by_id[job_id], queue.get_job(job_id)
        assert (job.payload, job.attempt) == (row.payload, row.attempts)
        assert job.max_attempts == row.max_attempts
        assert (job.created_at, job.started_at, job.lease_expires_at) == (
            row.created_at,
            row.started_at,
            row.lease_expires_at,
        )
        for moment in (job.created_at, job.started_at, job.lease_expires_at):
            assert moment.utcoffset() == timedelta(0)
        assert job.lease_expires_at - job.started_at == timedelta(seconds=30)
    assert by_id[first].payload == payload
    assert by_id[first].attempt == 2
    assert [entry["error"] for entry in by_id[first].errors] == ["boom"]
    assert by_id[second].errors == ()


#: How to read a connection's durability, set it stricter than the default, and what the
#: stricter level reads as: by the capability that says which statements the backend has.
DURABILITY: dict[str, tuple[str, str, object]] = {
    "pragmas": ("PRAGMA synchronous", "PRAGMA synchronous = EXTRA", 3),
    "transaction_settings": (
        "SHOW synchronous_commit",
        "SET synchronous_commit = remote_apply",
        "remote_apply",
    ),
}


@pytest.mark.parametrize("settings", DURABILITY)
def test_a_relaxed_round_leaves_the_connection_at_its_own_durability(backend, settings):
    """The worker's rounds commit without waiting for the disk (SQLite ``synchronous =
    NORMAL``, PostgreSQL ``synchronous_commit = off``) for their own transaction only: the
    pooled connection goes back to whatever level it had, here set stricter than the default."""
    backend.requires(settings)
    read, strict, expected = DURABILITY[settings]
    queue, _grouped, _plain = _queue_with_jobs(backend)
    with backend.engine.connect() as conn:
        conn.exec_driver_sql(strict)
        conn.commit()
    _, [claimed] = _cycle(queue, "w1", limit=2)
    landed, _ = _cycle(queue, "w1", succeeded=[job.fence for job in claimed])
    assert landed == {job.id for job in claimed}
    assert backend.engine.pool.checkedin() == 1  # the one connection every step above used
    with backend.engine.connect() as conn:
        assert conn.exec_driver_sql(read).scalar_one() == expected


#: What a relaxed transaction reads of its durability (see ``DURABILITY``), by capability.
RELAXED = {"pragmas": 1, "transaction_settings": "off"}


@pytest.mark.parametrize("settings", DURABILITY)
def test_only_a_relaxed_write_commits_without_waiting_for_the_disk(backend, settings):
    """Inside the worker's relaxed transactions the commit skips the disk; any other write
    transaction of the store keeps the connection's level."""
    backend.requires(settings)
    read, _strict, _ = DURABILITY[settings]
    queue = backend.queue()
    store = queue.store

    def level(conn):
        return conn.exec_driver_sql(read).scalar_one()

    with backend.engine.connect() as conn:
        default = level(conn)
    assert in_write(store.engine, store.dialect, level, relaxed=True) == RELAXED[settings]
    assert in_write(store.engine, store.dialect, level) == default
    assert in_write(store.engine, store.dialect, level, relaxed=True) == RELAXED[settings]


def test_after_a_relaxed_round_the_apps_transactions_still_roll_back(backend):
    """A relaxed round may set its pooled connection up differently for its own transaction;
    the app that gets the connection next still has a transaction to roll back."""
    queue, _grouped, _plain = _queue_with_jobs(backend)
    work = queue.tasks["work"]
    _, [claimed] = _cycle(queue, "w1", limit=2)
    _cycle(queue, "w1", succeeded=[job.fence for job in claimed])
    assert backend.engine.pool.checkedin() == 1  # the connection both rounds used
    with backend.engine.connect() as conn:
        job_id = work.enqueue(conn)
        conn.rollback()
    assert queue.get_job(job_id) is None


def test_a_relaxed_round_that_fails_leaves_nothing_written(backend):
    """A relaxed round whose statement fails rolls back whole: an outcome written before the
    failure is not kept, and the connection serves the next round."""
    queue, _grouped, _plain = _queue_with_jobs(backend)
    store = queue.store
    _, [claimed] = _cycle(queue, "w1", limit=5)

    def complete_then_fail(conn):
        store._write_outcomes(conn, "w1", [job.fence for job in claimed], [], None, None)
        conn.exec_driver_sql("SELECT * FROM no_such_table")

    with pytest.raises(sqlqueue.SchemaNotMigrated, match="no_such_table"):
        in_write(store.engine, store.dialect, complete_then_fail, relaxed=True)
    assert {queue.get_job(job.id).status for job in claimed} == {"running"}
    landed, _ = _cycle(queue, "w1", succeeded=[job.fence for job in claimed])
    assert landed == {job.id for job in claimed}


#: A session setting that changes how the server writes a claim's timestamps as text, by the
#: capability of the backends that have such sessions (PostgreSQL writes ``timestamptz`` in
#: the session's time zone): a claim must read the same instants whatever it is.
SESSION_TIME_ZONE = {"transaction_settings": "SET TIME ZONE 'Asia/Kolkata'"}


@pytest.mark.parametrize("capability", SESSION_TIME_ZONE)
def test_a_claim_reads_its_timestamps_exactly_in_any_session_time_zone(backend, capability):
    """PostgreSQL's claim returns its timestamps as text, read once per distinct value (it
    was psycopg's zone-aware datetime per value): in a session whose time zone is +05:30 the
    claimed jobs still carry the row's instants, in UTC, to the microsecond."""
    backend.requires(capability)
    queue, _grouped, plain = _queue_with_jobs(backend)
    with backend.engine.connect() as conn:
        conn.exec_driver_sql(SESSION_TIME_ZONE[capability])
        conn.commit()
    _, [claimed] = _cycle(queue, "w1", limit=10)
    assert backend.engine.pool.checkedin() == 1  # the claim ran in that session
    assert {job.id for job in claimed} >= set(plain)
    for job in claimed:
        row = queue.get_job(job.id)
        assert (job.next_run_at, job.created_at, job.started_at, job.lease_expires_at) == (
            row.next_run_at,
            row.created_at,
            row.started_at,
            row.lease_expires_at,
        )
        for moment in (job.next_run_at, job.created_at, job.started_at, job.lease_expires_at):
            assert moment.utcoffset() == timedelta(0)


def test_a_claim_in_a_session_with_a_non_iso_datestyle_says_what_to_set(backend):
    """A claim's timestamps are read in PostgreSQL's ISO DateStyle (as psycopg reads them):
    another one is refused with an error that names the setting, and nothing is claimed."""
    backend.requires("transaction_settings")
    queue, _grouped, _plain = _queue_with_jobs(backend)
    with backend.engine.connect() as conn:
        conn.exec_driver_sql("SET DateStyle = 'SQL, DMY'")
        conn.commit()
    with pytest.raises(sqlqueue.ConfigurationError, match="DateStyle"):
        _cycle(queue, "w1", limit=10)
    with backend.engine.connect() as conn:
        conn.exec_driver_sql("SET DateStyle = 'ISO, MDY'")
        conn.commit()
    _, [claimed] = _cycle(queue, "w1", limit=10)
    assert len(claimed) == 4  # one of the group, the three plain: the refused claim rolled back
