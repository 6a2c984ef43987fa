"""Middleware and enqueue hooks (issue 25): ``@queue.middleware`` around every attempt, the
first registered outermost, sync and async around sync and async handlers, its errors
classified like a handler's; ``@queue.on_enqueue`` altering or refusing each job before it is
written, on every enqueue path."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import pytest

import sqlqueue
from sqlqueue._middleware import for_sync_handlers, public_job
from sqlqueue._store.rows import ClaimedJob
from sqlqueue._worker.scheduler import Scheduler
from sqlqueue.testing import drain
from tests._support import count_jobs
from tests.conftest import Backend

pytestmark = pytest.mark.timeout(120)

Trail = list[tuple[str, Any]]


def _run(queue: sqlqueue.Queue, job_type: str, payload: dict[str, Any]) -> sqlqueue.Job:
    with queue.engine.begin() as conn:
        job_id = queue.enqueue(conn, job_type, payload)
    drain(queue)
    job = queue.get_job(job_id)
    assert job is not None
    return job


def _sync_mw(name: str, trail: Trail) -> Callable[[sqlqueue.Job, Callable[[], Any]], Any]:
    def middleware(job: sqlqueue.Job, call_next: Callable[[], Any]) -> Any:
        trail.append((f"{name} before", job.job_type))
        result = call_next()
        trail.append((f"{name} after", result))
        return result

    return middleware


def _async_mw(
    name: str, trail: Trail
) -> Callable[[sqlqueue.Job, Callable[[], Awaitable[Any]]], Awaitable[Any]]:
    async def middleware(job: sqlqueue.Job, call_next: Callable[[], Awaitable[Any]]) -> Any:
        trail.append((f"{name} before", job.job_type))
        result = await call_next()
        trail.append((f"{name} after", result))
        return result

    return middleware


def _expected(names: list[str], job_type: str, result: Any) -> Trail:
    return [
        *((f"{name} before", job_type) for name in names),
        ("handler", result),
        *((f"{name} after", result) for name in reversed(names)),
    ]


def test_sync_and_async_middleware_wrap_a_sync_handler_first_registered_outermost(
    backend: Backend,
) -> None:
    queue = backend.queue()
    trail: Trail = []

    @queue.task("add")
    def add(a: int, b: int) -> int:
        trail.append(("handler", a + b))
        return a + b

    queue.middleware(_sync_mw("one", trail))
    queue.middleware(_async_mw("two", trail))  # in a loop of its own, on the handler's thread
    queue.middleware(_sync_mw("three", trail))
    job = _run(queue, "add", {"a": 2, "b": 3})
    assert (job.status, job.result) == (sqlqueue.JobStatus.SUCCEEDED, 5)
    assert trail == _expected(["one", "two", "three"], "add", 5)


def test_async_middleware_wrap_an_async_handler_in_order(backend: Backend) -> None:
    queue = backend.queue()
    trail: Trail = []
    for name in ("one", "two", "three"):
        queue.middleware(_async_mw(name, trail))

    @queue.task("greet")  # registered after the middleware: it gets them too
    async def greet(name: str) -> str:
        trail.append(("handler", f"hi {name}"))
        return f"hi {name}"

    job = _run(queue, "greet", {"name": "ada"})
    assert job.result == "hi ada"
    assert trail == _expected(["one", "two", "three"], "greet", "hi ada")


def test_a_middleware_sees_the_running_job_and_may_change_the_result(backend: Backend) -> None:
    queue = backend.queue()
    seen: list[sqlqueue.Job] = []
    queue.task("echo")(lambda word: word)

    @queue.middleware
    def shout(job: sqlqueue.Job, call_next: Callable[[], Any]) -> Any:
        seen.append(job)
        return str(call_next()).upper()

    job = _run(queue, "echo", {"word": "quiet"})
    assert job.result == "QUIET"
    (running,) = seen
    assert isinstance(running, sqlqueue.Job)
    assert (running.id, running.status, running.attempts) == (job.id, "running", 1)
    assert running.payload == {"word": "quiet"}


def test_a_sync_middleware_cannot_wrap_an_async_handler_whichever_comes_first(
    backend: Backend,
) -> None:
    queue = backend.queue()
    trail: Trail = []

    @queue.task("later")
    async def later() -> None:
        """An async task."""

    with pytest.raises(sqlqueue.ConfigurationError, match="cannot wrap the async task 'later'"):
        queue.middleware(_sync_mw("blocking", trail))
    # Refused whole: the queue has no middleware, so an async one still fits.
    queue.middleware(_async_mw("fine", trail))

    other = backend.queue()
    other.middleware(_sync_mw("blocking", trail))
    other.task("sync_ok")(lambda: None)
    with pytest.raises(sqlqueue.ConfigurationError, match="make it an `async def` middleware"):
        other.task("async_refused")(later.handler)


def test_a_sync_middleware_for_sync_handlers_only_lets_async_handlers_go_without_it(
    backend: Backend,
) -> None:
    """An integration's middleware that belongs on a handler's thread (Django's connections)
    wraps every sync handler and is left out of async ones, instead of refusing them."""
    queue = backend.queue()
    trail: Trail = []
    queue.middleware(for_sync_handlers(_sync_mw("threads", trail)))

    @queue.task("nap")
    async def nap() -> str:
        trail.append(("handler", "napped"))
        return "napped"

    @queue.task("add")
    def add(a: int, b: int) -> int:
        trail.append(("handler", a + b))
        return a + b

    assert _run(queue, "nap", {}).result == "napped"
    assert trail == [("handler", "napped")]
    trail.clear()
    assert _run(queue, "add", {"a": 1, "b": 2}).result == 3
    assert trail == _expected(["threads"], "add", 3)


def _one_argument(job: sqlqueue.Job) -> None:
    """Not a middleware: no call_next."""


def _no_argument() -> None:
    """Not a hook: no request."""


def test_a_middleware_of_the_wrong_shape_is_refused(backend: Backend) -> None:
    queue = backend.queue()
    with pytest.raises(sqlqueue.ConfigurationError, match=r"must take \(job, call_next\)"):
        queue.middleware(_one_argument)  # type: ignore[arg-type]
    with pytest.raises(sqlqueue.ConfigurationError, match=r"must take \(request\)"):
        queue.on_enqueue(_no_argument)  # type: ignore[arg-type]


@pytest.mark.parametrize("where", ["before", "after"])
def test_an_error_in_a_middleware_is_classified_like_a_handlers(
    backend: Backend, where: str
) -> None:
    queue = backend.queue()
    ran: list[int] = []

    @queue.task("work", max_attempts=3)
    def work(n: int) -> int:
        ran.append(n)
        return n

    @queue.middleware
    def flaky(job: sqlqueue.Job, call_next: Callable[[], Any]) -> Any:
        if where == "before":
            raise ConnectionError("broker down")
        call_next()
        raise ConnectionError("broker down")

    job = _run(queue, "work", {"n": 1})
    assert (job.status, job.attempts) == (sqlqueue.JobStatus.FAILED, 1)  # retried later
    assert job.last_error == "ConnectionError: broker down"
    assert ran == ([] if where == "before" else [1])


def test_a_permanent_error_from_an_async_middleware_kills_the_job(backend: Backend) -> None:
    queue = backend.queue()

    @queue.task("pay", max_attempts=5)
    async def pay(amount: int) -> None:
        raise AssertionError("never called")

    @queue.middleware
    async def guard(job: sqlqueue.Job, call_next: Callable[[], Awaitable[Any]]) -> Any:
        if job.payload["amount"] < 0:
            raise sqlqueue.PermanentError("negative amount")
        return await call_next()

    job = _run(queue, "pay", {"amount": -1})
    assert (job.status, job.attempts) == (sqlqueue.JobStatus.DEAD, 1)
    assert job.last_error is not None
    assert "negative amount" in job.last_error


def test_a_middleware_sees_the_handlers_error_and_may_swallow_it(backend: Backend) -> None:
    queue = backend.queue()
    caught: list[str] = []

    @queue.task("boom")
    def boom() -> None:
        raise ValueError("bad row")

    @queue.middleware
    def forgiving(job: sqlqueue.Job, call_next: Callable[[], Any]) -> Any:
        try:
            return call_next()
        except ValueError as error:
            caught.append(str(error))
            return "skipped"

    job = _run(queue, "boom", {})
    assert (job.status, job.result, caught) == (
        sqlqueue.JobStatus.SUCCEEDED,
        "skipped",
        ["bad row"],
    )


# -- on_enqueue -----------------------------------------------------------------------------


class QuotaExceeded(sqlqueue.EnqueueError):
    """The app's refusal."""


def _hooked(backend: Backend) -> sqlqueue.Queue:
    queue = backend.queue()
    queue.task("notify")(lambda user_id, tenant=None: None)
    queue.task("summary")(lambda tenant=None: None)

    @queue.on_enqueue
    def stamp_tenant(request: sqlqueue.JobRequest) -> sqlqueue.JobRequest:
        if request.payload.get("user_id") == 666:
            raise QuotaExceeded("user 666 is over quota")
        return dataclasses.replace(
            request, payload={**request.payload, "tenant": "acme"}, priority=7
        )

    return queue


def test_on_enqueue_alters_every_job_before_it_is_written(backend: Backend) -> None:
    queue = _hooked(backend)
    with backend.engine.begin() as conn:
        one = queue.enqueue(conn, "notify", {"user_id": 1})
        many = queue.enqueue_many(
            conn, [sqlqueue.JobRequest(job_type="notify", payload={"user_id": n}) for n in (2, 3)]
        )
        via_task = queue.tasks["notify"].enqueue(conn, user_id=4)
        batch = queue.enqueue_batch(
            conn,
            [sqlqueue.JobRequest(job_type="notify", payload={"user_id": 5})],
            on_complete=sqlqueue.JobRequest(job_type="summary"),
        )
    ids = [one, *many, via_task, *batch.job_ids]
    for job in queue.jobs(job_ids=ids):
        assert (job.payload["tenant"], job.priority) == ("acme", 7)
    drain(queue)
    (callback,) = queue.jobs(job_type="summary")
    assert (callback.payload, callback.priority) == ({"tenant": "acme"}, 7)


def test_on_enqueue_refuses_with_an_enqueue_error_and_nothing_is_written(
    backend: Backend,
) -> None:
    queue = _hooked(backend)
    with pytest.raises(QuotaExceeded, match="over quota"), backend.engine.begin() as conn:
        queue.enqueue(conn, "notify", {"user_id": 666})
    with pytest.raises(QuotaExceeded), backend.engine.begin() as conn:
        queue.enqueue_many(
            conn, [sqlqueue.JobRequest(job_type="notify", payload={"user_id": n}) for n in (1, 666)]
        )
    assert count_jobs(backend.engine) == 0
    # The caller may catch it and carry on in the same transaction: still nothing of it written.
    with backend.engine.begin() as conn:
        with pytest.raises(sqlqueue.EnqueueError):
            queue.enqueue(conn, "notify", {"user_id": 666})
        kept = queue.enqueue(conn, "notify", {"user_id": 2})
    assert [job.id for job in queue.jobs()] == [kept]


def test_an_on_enqueue_hook_must_return_a_request(backend: Backend) -> None:
    queue = backend.queue()
    queue.task("t")(lambda: None)
    queue.on_enqueue(lambda request: None)  # type: ignore[arg-type,return-value]
    with (
        pytest.raises(sqlqueue.ConfigurationError, match="returned NoneType"),
        backend.engine.begin() as conn,
    ):
        queue.enqueue(conn, "t")
    assert count_jobs(backend.engine) == 0


def test_the_job_a_middleware_sees_has_every_field_of_a_job() -> None:
    now = datetime.now(UTC)
    claimed = ClaimedJob(
        id=3,
        job_type="t",
        queue="q",
        priority=1,
        payload={"a": 1},
        attempt=2,
        max_attempts=4,
        errors=({"attempt": 1, "at": now.isoformat(), "error": "E: x", "kind": "error"},),
        next_run_at=now,
        created_at=now,
        batch_id=None,
        started_at=now,
        lease_expires_at=now,
    )
    job = public_job(claimed)
    assert set(vars(job)) == {field.name for field in dataclasses.fields(sqlqueue.Job)}
    assert (job.attempts, job.last_error, job.errors[0].error) == (2, "E: x", "E: x")
    assert job == dataclasses.replace(job)  # a Job like any other


def test_on_enqueue_sees_periodic_jobs_and_a_handlers_follow_ups(backend: Backend) -> None:
    queue = backend.queue()
    stamped: list[str] = []

    @queue.on_enqueue
    def stamp(request: sqlqueue.JobRequest) -> sqlqueue.JobRequest:
        stamped.append(request.job_type)
        return dataclasses.replace(request, payload={**request.payload, "tenant": "acme"})

    @queue.periodic("0 3 * * *", "nightly")
    def nightly(tenant: str) -> None:
        """A periodic job."""

    queue.task("child")(lambda tenant: None)
    queue.task("done")(lambda tenant: None)

    @queue.task("fan")
    def fan(tenant: str, ctx: sqlqueue.JobContext) -> None:
        ctx.add_to_batch([sqlqueue.JobRequest(job_type="child")])

    [periodic] = Scheduler(queue, queue.periodic_schedules).run_once(
        now=datetime(2026, 11, 27, 3, 0, 30, tzinfo=UTC)
    )
    with backend.engine.begin() as conn:
        queue.enqueue_batch(
            conn,
            [sqlqueue.JobRequest(job_type="fan")],
            on_complete=sqlqueue.JobRequest(job_type="done"),
        )
    drain(queue)
    # (the drain's own scheduler may add today's nightly slot: stamped like the first)
    assert set(stamped) == {"child", "done", "fan", "nightly"}
    for job in queue.jobs():
        assert job.payload["tenant"] == "acme", job
    ran = queue.get_job(periodic)
    assert ran is not None
    assert ran.status is sqlqueue.JobStatus.SUCCEEDED
