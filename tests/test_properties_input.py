"""Property tests of the entry points that take outside text and numbers: enqueue (one, many,
with options) and the operators' filters and actions.

For arbitrary text (NUL, lone surrogates, line separators, very long strings), integers at and
beyond every column's range, and nested payloads, each call either succeeds and reads back
identical, or raises a typed sqlqueue error before any SQL is sent (an event counter on the
engine says none was); either way the caller's transaction stays usable (another write in it
commits), and a refused call leaves every job row as it was (the table is compared whole
before and after). The examples per run come from the active Hypothesis profile
(tests/_hypothesis.py): 15 in the default suite, 500 in ``nox -s hypothesis``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

import sqlqueue
from sqlqueue._schema import jobs
from tests.conftest import Backend

pytestmark = pytest.mark.property

#: Integers at and just beyond each limit a job column or option has.
EDGES = [
    0,
    1,
    -1,
    1_000_000,
    1_000_001,
    -1_000_000,
    -1_000_001,
    2**31 - 1,
    2**31,
    -(2**31),
    -(2**31) - 1,
    2**63 - 1,
    2**63,
    -(2**63) - 1,
    10**30,
]

#: Any character, lone surrogates and control characters included.
ANY_CHAR = st.characters(codec=None, exclude_categories=())
TRICKY = st.sampled_from(["\x00", "\u2028", "\u2029", "\x85", "\x0b", "\ud800", " ", "%", "_"])


def texts() -> st.SearchStrategy[str]:
    """Short arbitrary text, text around the tricky characters, and very long runs."""
    return st.one_of(
        st.text(ANY_CHAR, max_size=20),
        st.lists(st.one_of(TRICKY, ANY_CHAR), max_size=8).map("".join),
        st.builds(lambda c, n: c * n, ANY_CHAR, st.sampled_from([99, 100, 101, 254, 255, 256])),
        st.text(ANY_CHAR, min_size=180, max_size=260),
    )


def numbers() -> st.SearchStrategy[object]:
    """Integers at and beyond the limits, and things that are not integers."""
    return st.one_of(
        st.sampled_from(EDGES),
        st.integers(),
        st.floats(allow_nan=True),
        st.booleans(),
        st.sampled_from(["1", b"1"]),
    )


JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(ANY_CHAR, max_size=30),
)
PAYLOADS = st.dictionaries(
    st.text(ANY_CHAR, max_size=10),
    st.recursive(
        JSON_LEAVES,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)
        ),
        max_leaves=12,
    ),
    max_size=5,
)

OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "queue": texts(),
        "idempotency_key": texts(),
        "group_key": texts(),
        "priority": numbers(),
        "max_attempts": numbers(),
        "delay": st.one_of(
            st.floats(allow_nan=True),
            st.sampled_from([0, 1e10, 2.5e11, 1e12, 1e300]),
            st.booleans(),
        ),
    },
)


@contextmanager
def counted(engine: sa.Engine) -> Iterator[list[str]]:
    """The statements sent on ``engine`` inside the block."""
    sent: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    sa.event.listen(engine, "before_cursor_execute", count)
    try:
        yield sent
    finally:
        sa.event.remove(engine, "before_cursor_execute", count)


def rows(conn: sa.Connection) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in conn.execute(sa.select(jobs).order_by(jobs.c.id))]


def _queue(backend: Backend) -> sqlqueue.Queue:
    queue = backend.queue()

    @queue.task("t")
    def t(**payload: object) -> None:
        pass

    return queue


def _expected(options: dict[str, Any], field: str, default: object) -> object:
    value = options.get(field)
    return default if value is None or value == "" else value


def test_enqueue_either_reads_back_identical_or_refuses_before_any_sql(backend):
    queue = _queue(backend)
    keys: dict[str, int] = {}

    @given(job_type=st.one_of(st.just("t"), texts()), payload=PAYLOADS, options=OPTIONS)
    def enqueue_one(job_type: str, payload: dict[str, Any], options: dict[str, Any]) -> None:
        with backend.engine.connect() as conn:
            with conn.begin():
                before = rows(conn)
                with counted(backend.engine) as sent:
                    try:
                        job_id = queue.enqueue(
                            conn, job_type, payload, external=job_type != "t", **options
                        )
                    except sqlqueue.EnqueueError:
                        assert sent == [], f"SQL sent before the error: {sent}"
                        job_id = None
                if job_id is None:
                    assert rows(conn) == before
                # The transaction is usable either way.
                queue.enqueue(conn, "t", {"after": True})
            if job_id is None:
                return
            key = options.get("idempotency_key")
            if key is not None and key in keys:
                assert job_id == keys[key], "an existing key must return its job"
                return
            if key is not None:
                keys[key] = job_id
        job = queue.get_job(job_id)
        assert job is not None
        assert job.job_type == job_type
        assert job.payload == payload
        assert job.queue == _expected(options, "queue", "default")
        assert job.priority == _expected(options, "priority", 0)
        assert job.max_attempts == _expected(options, "max_attempts", 8)
        assert job.idempotency_key == options.get("idempotency_key")
        assert job.group_key == options.get("group_key")
        if options.get("delay"):
            assert job.next_run_at > datetime.now(UTC) + timedelta(seconds=options["delay"] - 3600)

    enqueue_one()


def test_enqueue_many_writes_all_or_nothing_before_any_sql(backend):
    queue = _queue(backend)

    @given(st.lists(st.tuples(PAYLOADS, OPTIONS), min_size=1, max_size=4))
    def enqueue_many(requests: list[tuple[dict[str, Any], dict[str, Any]]]) -> None:
        batch = [
            sqlqueue.JobRequest(job_type="t", payload=payload, **options)
            for payload, options in requests
        ]
        with backend.engine.connect() as conn, conn.begin():
            before = rows(conn)
            with counted(backend.engine) as sent:
                try:
                    ids = queue.enqueue_many(conn, batch)
                except sqlqueue.EnqueueError:
                    assert sent == [], f"SQL sent before the error: {sent}"
                    ids = None
            if ids is None:
                assert rows(conn) == before
            else:
                assert len(ids) == len(batch)
            queue.enqueue(conn, "t", {"after": True})

    enqueue_many()


FILTERS = st.fixed_dictionaries(
    {},
    optional={
        "job_type": st.one_of(st.just("boom"), texts()),
        "queue": st.one_of(st.just("default"), texts()),
        "error_contains": st.one_of(st.just("broke"), texts()),
        "job_ids": st.lists(numbers(), max_size=3),
        "since": st.sampled_from(
            [
                datetime(1, 1, 1, tzinfo=UTC),
                datetime(999, 12, 31, tzinfo=UTC),
                datetime(1000, 1, 1, tzinfo=UTC),
                datetime(2000, 1, 1, tzinfo=UTC),
                datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
            ]
        ),
    },
)


def _dead_jobs(backend: Backend) -> sqlqueue.Queue:
    queue = backend.queue()

    @queue.task("boom", max_attempts=1)
    def boom(error: str) -> None:
        raise ValueError(error)

    with backend.engine.begin() as conn:
        for error in ["it broke", "it BROKE down", "timeout \u2028 line", "50% _done"]:
            boom.enqueue(conn, error=error)
    queue.worker(poll_interval=0.02).run(burst=True)
    return queue


def _matches(job: sqlqueue.Job, where: dict[str, Any]) -> bool:
    """Whether ``job`` matches ``where`` exactly (a case-insensitive ``error_contains`` for the
    backends whose LIKE ignores ASCII case is checked as the looser bound)."""
    needle = where.get("error_contains")
    return (
        where.get("job_type", job.job_type) == job.job_type
        and where.get("queue", job.queue) == job.queue
        and (not needle or needle in (job.last_error or ""))
        and ("job_ids" not in where or job.id in [int(i) for i in where["job_ids"]])
    )


def test_operators_filters_find_exactly_the_matching_jobs_or_refuse_before_any_sql(backend):
    queue = _dead_jobs(backend)
    everything = queue.jobs(limit=100)

    @given(where=FILTERS)
    def search(where: dict[str, Any]) -> None:
        before = queue.jobs(limit=100)
        with counted(backend.engine) as sent:
            try:
                found = queue.jobs(limit=100, **where)
            except sqlqueue.ConfigurationError:
                assert sent == [], f"SQL sent before the error: {sent}"
                found = None
        if found is None:
            assert queue.jobs(limit=100) == before
            return
        since = where.get("since")
        candidates = [j for j in everything if since is None or j.updated_at >= since]
        exact = {j.id for j in candidates if _matches(j, where)}
        loose_where = {**where, "error_contains": (where.get("error_contains") or "").lower()}
        loose = {
            j.id
            for j in candidates
            if _matches(replace(j, last_error=(j.last_error or "").lower()), loose_where)
        }
        assert exact <= {j.id for j in found} <= loose, (where, [j.id for j in found])

    search()


def test_operators_actions_act_or_refuse_before_any_sql_and_lose_nothing(backend):
    queue = _dead_jobs(backend)

    @given(where=FILTERS, by=texts(), reason=texts())
    def act(where: dict[str, Any], by: str, reason: str) -> None:
        where.pop("since", None)
        with backend.engine.connect() as conn:
            before = rows(conn)
        for action in (queue.discard_where, queue.requeue_where):
            with counted(backend.engine) as sent:
                try:
                    action(by=by, reason=reason, **where)
                except sqlqueue.ConfigurationError:
                    assert sent == [], f"SQL sent before the error: {sent}"
                    with backend.engine.connect() as conn:
                        assert rows(conn) == before

    act()
