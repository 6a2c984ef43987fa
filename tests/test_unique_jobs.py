"""Unique jobs (``sqlqueue.Unique``) on every backend: keep, replace (debounce), period buckets,
the statuses that block, per-enqueue overrides, bad input, and 50 enqueuers racing one key."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

import sqlqueue
from sqlqueue._schema import jobs
from sqlqueue._unique import unique_key
from tests._support import count_jobs, drain, wait_until

RACERS = 50


def _queue(backend, unique):
    queue = backend.queue()
    ran: list[dict[str, object]] = []

    @queue.task("sync_user", unique=unique)
    def sync_user(user_id: int, note: str = "") -> None:
        ran.append({"user_id": user_id, "note": note})

    return queue, sync_user, ran


def test_keep_returns_the_existing_job_and_writes_nothing(backend):
    queue, sync_user, _ = _queue(backend, sqlqueue.Unique(by=("user_id",)))
    with queue.engine.begin() as conn:
        first = sync_user.enqueue(conn, user_id=1, note="first")
        again = sync_user.enqueue(conn, user_id=1, note="second")
        other = sync_user.enqueue(conn, user_id=2)
    with queue.engine.begin() as conn:
        later = sync_user.enqueue(conn, user_id=1, note="third")
    assert again == first == later
    assert other != first
    assert count_jobs(backend.engine) == 2
    job = queue.get_job(first)
    assert job is not None
    assert job.payload == {"user_id": 1, "note": "first"}


def test_replace_debounces_a_queued_job(backend):
    queue, sync_user, _ = _queue(backend, sqlqueue.Unique(by=("user_id",), on_conflict="replace"))
    with queue.engine.begin() as conn:
        first = sync_user.options(delay=60).enqueue(conn, user_id=1, note="first")
    before = queue.get_job(first)
    assert before is not None
    with queue.engine.begin() as conn:
        second = sync_user.options(delay=3600).enqueue(conn, user_id=1, note="second")
    after = queue.get_job(first)
    assert second == first
    assert count_jobs(backend.engine) == 1
    assert after is not None
    assert after.payload == {"user_id": 1, "note": "second"}
    assert after.next_run_at - before.next_run_at > timedelta(minutes=50)


def test_replace_keeps_a_job_that_already_started(backend):
    unique = sqlqueue.Unique(by=("user_id",), on_conflict="replace")
    queue, sync_user, _ = _queue(backend, unique)
    with queue.engine.begin() as conn:
        first = sync_user.enqueue(conn, user_id=1, note="first")
    claimed = queue.store.claim(
        queues=["default"], job_types=None, limit=1, worker_id="w", lease_seconds=60
    )
    assert [job.id for job in claimed] == [first]
    with queue.engine.begin() as conn:
        again = sync_user.enqueue(conn, user_id=1, note="second")
    assert again == first
    job = queue.get_job(first)
    assert job is not None
    assert job.status == "running"
    assert job.payload == {"user_id": 1, "note": "first"}


def test_a_job_that_left_the_states_frees_the_key(backend):
    queue, sync_user, ran = _queue(backend, sqlqueue.Unique(by=("user_id",)))
    with queue.engine.begin() as conn:
        first = sync_user.enqueue(conn, user_id=1)
    drain(queue)
    assert ran == [{"user_id": 1, "note": ""}]
    with queue.engine.begin() as conn:
        second = sync_user.enqueue(conn, user_id=1)
    assert second != first
    assert count_jobs(backend.engine) == 2


def test_succeeded_in_states_holds_the_key_after_the_job_ran(backend):
    unique = sqlqueue.Unique(by=("user_id",), states=("queued", "running", "succeeded"))
    queue, sync_user, _ = _queue(backend, unique)
    with queue.engine.begin() as conn:
        first = sync_user.enqueue(conn, user_id=1)
    drain(queue)
    with queue.engine.begin() as conn:
        assert sync_user.enqueue(conn, user_id=1) == first
    assert count_jobs(backend.engine) == 1


def test_a_cancelled_job_frees_the_key(backend):
    queue, sync_user, _ = _queue(backend, sqlqueue.Unique(by=("user_id",)))
    with queue.engine.begin() as conn:
        first = sync_user.enqueue(conn, user_id=1)
    queue.cancel(first)
    with queue.engine.begin() as conn:
        assert sync_user.enqueue(conn, user_id=1) != first


def test_a_period_holds_the_key_within_its_bucket_only(backend):
    queue, sync_user, _ = _queue(backend, sqlqueue.Unique(by=("user_id",), period=1))

    def enqueue() -> int:
        with queue.engine.begin() as conn:
            return int(sync_user.enqueue(conn, user_id=1))

    first = enqueue()
    # Within a bucket the first job comes back; once the next second's bucket starts, a new
    # job is written (polled: enqueue until it returns another id).
    wait_until(lambda: enqueue() != first)
    assert count_jobs(backend.engine) == 2


def test_period_buckets_are_fixed_windows():
    unique = sqlqueue.Unique(by=("user_id",), period=60)
    start = datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp()
    key = unique_key("t", unique, {"user_id": 1}, now=start)
    assert unique_key("t", unique, {"user_id": 1}, now=start + 59.9) == key
    assert unique_key("t", unique, {"user_id": 1}, now=start + 60) != key
    assert unique_key("other", unique, {"user_id": 1}, now=start) != key
    assert unique_key("t", unique, {"user_id": 2}, now=start) != key


def test_per_enqueue_unique_overrides_the_task(backend):
    queue, sync_user, _ = _queue(backend, None)
    unique = sqlqueue.Unique(by=("user_id",))
    with queue.engine.begin() as conn:
        plain = [sync_user.enqueue(conn, user_id=1) for _ in range(2)]
        first = sync_user.options(unique=unique).enqueue(conn, user_id=1)
        again = queue.enqueue(conn, "sync_user", {"user_id": 1}, unique=unique)
        many = queue.enqueue_many(
            conn,
            [
                sqlqueue.JobRequest(job_type="sync_user", payload={"user_id": 1}, unique=unique),
                sqlqueue.JobRequest(job_type="sync_user", payload={"user_id": 3}, unique=unique),
                sqlqueue.JobRequest(job_type="sync_user", payload={"user_id": 3}, unique=unique),
                sqlqueue.JobRequest(job_type="sync_user", payload={"user_id": 4}),
            ],
        )
    assert plain[0] != plain[1]
    assert again == first == many[0]
    assert many[1] == many[2] != many[3]
    assert count_jobs(backend.engine) == 5  # two plain, user 1, user 3, user 4


def test_unique_by_a_callable(backend):
    unique = sqlqueue.Unique(by=lambda payload: payload["user_id"] % 10)
    queue, sync_user, _ = _queue(backend, unique)
    with queue.engine.begin() as conn:
        assert sync_user.enqueue(conn, user_id=3) == sync_user.enqueue(conn, user_id=13)


def test_unique_and_idempotency_key_together(backend):
    queue, sync_user, _ = _queue(backend, sqlqueue.Unique(by=("user_id",)))
    with queue.engine.begin() as conn:
        first = sync_user.options(idempotency_key="k").enqueue(conn, user_id=1)
        # Another unique key, same idempotency key: the idempotency key still wins.
        assert sync_user.options(idempotency_key="k").enqueue(conn, user_id=2) == first
    row_keys = _unique_keys(backend)
    assert len(row_keys) == 1


def _unique_keys(backend) -> list[str | None]:
    with backend.engine.connect() as conn:
        return list(conn.execute(sa.select(jobs.c.unique_key)).scalars())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"by": 5}, "Unique.by must be payload key names or a callable"),
        ({"by": ("",)}, "non-empty key names"),
        ({"period": 0}, "Unique.period must be > 0"),
        ({"period": float("nan")}, "Unique.period must be > 0"),
        ({"states": ("waiting",)}, "Unique.states must name"),
        ({"states": ()}, "Unique.states must name"),
        ({"on_conflict": "merge"}, 'Unique.on_conflict must be "keep" or "replace"'),
    ],
)
def test_bad_declarations_are_refused(options, message):
    with pytest.raises(sqlqueue.ConfigurationError, match=message):
        sqlqueue.Unique(**options)


def test_bad_input_at_enqueue_writes_nothing(backend):
    queue, _sync_user, _ = _queue(backend, sqlqueue.Unique(by=("user_id",)))

    @queue.task("with_set", unique=sqlqueue.Unique(by=lambda payload: {1, 2}))
    def with_set() -> None:
        pass

    @queue.task("by_user", unique=sqlqueue.Unique(by=("user_id",)))
    def by_user(**payload: object) -> None:
        pass

    with queue.engine.begin() as conn:
        with pytest.raises(sqlqueue.EnqueueError, match="payload has no 'user_id' key"):
            queue.enqueue(conn, "by_user", {"note": "x"})
        with pytest.raises(sqlqueue.EnqueueError, match="must be JSON"):
            queue.enqueue(conn, "with_set")
        with pytest.raises(sqlqueue.EnqueueError, match=r"must be a sqlqueue\.Unique"):
            queue.enqueue(conn, "sync_user", {"user_id": 1}, unique="user_id")
        with pytest.raises(sqlqueue.EnqueueError, match="children of a batch cannot be"):
            queue.enqueue_batch(
                conn, [sqlqueue.JobRequest(job_type="sync_user", payload={"user_id": 1})]
            )
    assert count_jobs(backend.engine) == 0
    with pytest.raises(sqlqueue.ConfigurationError, match=r"must be a sqlqueue\.Unique"):
        queue.task("bad", unique=("user_id",))(lambda: None)


@pytest.mark.parametrize("key_row", ["new", "existing"])
@pytest.mark.parametrize("on_conflict", ["keep", "replace"])
def test_concurrent_enqueuers_of_one_key_write_one_job(backend, on_conflict, key_row):
    """With ``key_row="existing"`` a job with the key already ran (its key's lock row is
    there, and no job in the states holds the key): the racers cannot take turns on the
    insert of that row, only on its lock. Without the lock this left 3-10 queued jobs a
    round on PostgreSQL; the race on a new key alone never showed it."""
    unique = sqlqueue.Unique(by=("user_id",), on_conflict=on_conflict)
    queue, sync_user, _ = _queue(backend, unique)
    before = 0
    if key_row == "existing":
        with backend.engine.begin() as conn:
            sync_user.enqueue(conn, user_id=7, note="ran before")
        drain(queue)
        before = 1
    engine = sa.create_engine(backend.url, pool_size=RACERS, max_overflow=0)
    racer_queue = sqlqueue.Queue(engine)
    racer_queue.task("sync_user", unique=unique)(lambda user_id, note="": None)
    start = threading.Barrier(RACERS)
    ids: list[int] = []
    errors: list[BaseException] = []
    applied: list[str] = []
    lock = threading.Lock()

    def race(n: int) -> None:
        try:
            start.wait()
            with engine.begin() as conn:
                job_id = racer_queue.enqueue(
                    conn, "sync_user", {"user_id": 7, "note": f"racer {n}"}
                )
            # Committed: under the key's lock, the last to commit is the last applied.
            with lock:
                ids.append(job_id)
                applied.append(f"racer {n}")
        except BaseException as error:
            with lock:
                errors.append(error)

    threads = [threading.Thread(target=race, args=(n,)) for n in range(RACERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    engine.dispose()
    assert errors == []
    assert len(set(ids)) == 1
    assert count_jobs(backend.engine) == before + 1
    job = queue.get_job(ids[0])
    assert job is not None
    if on_conflict == "keep":
        assert job.payload["note"] in applied
    else:  # every racer replaced the queued job in turn: it holds one racer's payload
        assert job.payload["note"] in applied
        assert count_jobs(backend.engine, status="queued") == 1


json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=20), st.floats(allow_nan=False)
)


@given(
    by=st.lists(st.text(min_size=1, max_size=20), min_size=1, max_size=4, unique=True),
    values=st.lists(json_scalars, min_size=4, max_size=4),
)
def test_keys_of_any_json_payload_are_fixed_size_and_deterministic(by, values):
    unique = sqlqueue.Unique(by=tuple(by))
    payload = dict(zip(by, values, strict=False))
    key = unique_key("task", unique, payload)
    assert len(key) == 64
    assert key == unique_key("task", unique, dict(reversed(payload.items())))


@given(by=st.one_of(st.integers(), st.lists(st.integers(), min_size=1), st.binary()))
def test_by_that_names_no_keys_is_refused(by):
    with pytest.raises(sqlqueue.ConfigurationError):
        sqlqueue.Unique(by=by)
