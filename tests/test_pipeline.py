"""One attempt pipeline: each task plans its steps when it is registered, and a step added to
the pipeline applies to every route (direct on a handler thread, in an asyncio task, on the
loop)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import sqlqueue
from sqlqueue._store.rows import ClaimedJob
from sqlqueue._task import Task
from sqlqueue._worker import pipeline as _pipeline
from sqlqueue._worker.pipeline import Call, Step
from tests._support import drain


def _plain(n: int) -> int:
    return n


async def _async(n: int) -> int:
    return n


def _with_context(n: int, ctx: sqlqueue.JobContext) -> int:
    return n


async def _async_with_context(n: int, ctx: sqlqueue.JobContext) -> int:
    return n


PLANS = [
    pytest.param(_plain, {}, ("arguments", "thread", "handler", "result"), True, id="sync"),
    pytest.param(
        _async, {}, ("arguments", "watch", "loop", "handler", "result"), False, id="async"
    ),
    pytest.param(
        _plain,
        {"timeout": 5},
        ("arguments", "timeout", "watch", "thread", "handler", "result"),
        False,
        id="sync-timeout",
    ),
    pytest.param(
        _async,
        {"timeout": 5},
        ("arguments", "timeout", "watch", "loop", "handler", "result"),
        False,
        id="async-timeout",
    ),
    pytest.param(
        _with_context,
        {},
        ("arguments", "context", "watch", "thread", "handler", "result", "transaction"),
        False,
        id="sync-context",
    ),
    pytest.param(
        _async_with_context,
        {},
        ("arguments", "context", "watch", "loop", "handler", "result", "transaction"),
        False,
        id="async-context",
    ),
    pytest.param(
        _plain,
        {"rate_limit": sqlqueue.RateLimit(per_second=100)},
        ("arguments", "gates", "watch", "thread", "handler", "result"),
        False,
        id="sync-rate-limit",
    ),
    pytest.param(
        _plain,
        {"circuit_breaker": sqlqueue.CircuitBreaker()},
        ("arguments", "gates", "watch", "thread", "handler", "result"),
        False,
        id="sync-circuit-breaker",
    ),
]


@pytest.mark.parametrize(("handler", "options", "steps", "direct"), PLANS)
def test_a_task_plans_its_steps_when_it_is_registered(
    backend: Any, handler: Any, options: dict[str, Any], steps: tuple[str, ...], direct: bool
) -> None:
    queue = backend.queue()
    task = queue.task("job", **options)(handler)
    assert isinstance(task, Task)
    if queue.tracing is not None:  # OpenTelemetry installed: the attempt's span, outermost
        route = steps.index("handler")
        steps = (*steps[:route], "trace", *steps[route:])
    assert (task.plan.steps, task.plan.direct) == (steps, direct)
    assert task.plan.gates == ("gates" in steps)
    assert task.plan.context == ("ctx" if "context" in steps else None)


def _recording_step(name: str, calls: list[tuple[str, str, int, str]]) -> Step:
    """A step that records where it ran and multiplies the handler's ``n`` by 10 (as a
    secrets step would rewrite the arguments)."""

    def around(task: Task, call: Call) -> Call:
        if task.is_async:

            async def on_loop(job: ClaimedJob, kwargs: dict[str, Any]) -> Any:
                asyncio.get_running_loop()  # raises unless on the worker's loop
                calls.append((name, task.name, job.id, "loop"))
                return await call(job, {**kwargs, "n": kwargs["n"] * 10})

            return on_loop

        def in_thread(job: ClaimedJob, kwargs: dict[str, Any]) -> Any:
            calls.append((name, task.name, job.id, threading.current_thread().name))
            return call(job, {**kwargs, "n": kwargs["n"] * 10})

        return in_thread

    return Step(name=name, wanted=lambda task: task.name != "unwrapped", around=around)


def test_a_step_added_to_the_pipeline_applies_on_every_route(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, str, int, str]] = []
    monkeypatch.setattr(
        _pipeline, "STEPS", (_recording_step("outer", calls), _recording_step("inner", calls))
    )
    queue = backend.queue()
    routes: dict[str, tuple[Any, dict[str, Any]]] = {
        "sync": (_plain, {}),
        "async": (_async, {}),
        "sync_timeout": (_plain, {"timeout": 30}),
        "async_timeout": (_async, {"timeout": 30}),
        "sync_context": (_with_context, {}),
        "async_context": (_async_with_context, {}),
        "rate_limited": (_plain, {"rate_limit": sqlqueue.RateLimit(per_second=1000)}),
        "unwrapped": (_plain, {}),
    }
    tasks = {
        name: queue.task(name, **options)(handler) for name, (handler, options) in routes.items()
    }
    assert tasks["sync"].plan.steps == (
        "arguments",
        "thread",
        "outer",
        "inner",
        "handler",
        "result",
    )
    assert tasks["sync"].plan.direct
    assert "outer" not in tasks["unwrapped"].plan.steps
    with backend.engine.begin() as conn:
        ids = {name: task.enqueue(conn, n=1) for name, task in tasks.items()}
    drain(queue)

    for name, job_id in ids.items():
        job = queue.get_job(job_id)
        assert job.status == "succeeded", (name, job.last_error)
        assert job.result == (1 if name == "unwrapped" else 100), name
    by_job: dict[tuple[str, int], list[tuple[str, str]]] = {
        (task_name, job_id): [] for task_name, job_id in ids.items()
    }
    for step, task_name, job_id, where in calls:
        by_job[(task_name, job_id)].append((step, where))
    for name in ids:
        ran = by_job[(name, ids[name])]
        if name == "unwrapped":
            assert ran == []
        elif name.startswith("async"):
            assert ran == [("outer", "loop"), ("inner", "loop")], name
        else:
            assert [step for step, _ in ran] == ["outer", "inner"], name
            assert all(where.startswith("sqlqueue-handler") for _, where in ran), (name, ran)


def test_steps_are_composed_once_per_task_not_per_attempt(
    backend: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task made before a step was added keeps its plan: the step list is read once, when the
    task is registered, never per attempt."""
    queue = backend.queue()
    before = queue.task("before")(_plain)
    calls: list[tuple[str, str, int, str]] = []
    monkeypatch.setattr(_pipeline, "STEPS", (_recording_step("late", calls),))
    after = queue.task("after")(_plain)
    assert "late" not in before.plan.steps
    assert "late" in after.plan.steps
    with backend.engine.begin() as conn:
        before_id = before.enqueue(conn, n=2)
        after_id = after.enqueue(conn, n=2)
    drain(queue)
    assert (queue.get_job(before_id).result, queue.get_job(after_id).result) == (2, 20)
    assert [(step, task) for step, task, _, _ in calls] == [("late", "after")]
