"""The steps one attempt of a task goes through, decided once when the task is made.

Every attempt runs the same pipeline, in this order::

    arguments → gates → context → timeout → watch → thread | loop → <extra steps> → handler
              → result → transaction

A task's :class:`Plan` keeps only the steps it needs (a plain sync handler: ``arguments``,
``thread``, ``handler``, ``result``), so nothing per job asks again what the task is made of.
The loop-side steps (gates, context, watch, timeout) need an asyncio task per attempt; a plan
without any is *direct*: the executor starts it on a handler thread with no task of its own,
the worker's cheapest route. The steps from ``thread | loop`` on run wherever the handler runs
and are the same code on every route.

:data:`STEPS` is where a new step that wraps every handler call goes (the tracing span, secrets
decrypted into the arguments): each task composes the ones it wants around its handler once,
so they apply to sync and async handlers, direct or not, at no cost to tasks that do not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlqueue._middleware import compose
from sqlqueue._tracing import trace_step
from sqlqueue._worker.call_metrics import metrics_step, metrics_wanted

if TYPE_CHECKING:
    from sqlqueue._secrets import Redactor
    from sqlqueue._store.rows import ClaimedJob
    from sqlqueue._task import Task

__all__ = ["STEPS", "Call", "Plan", "Step", "plan"]

#: One handler call: the job and its keyword arguments in, the handler's return value out (for
#: an async handler, the awaitable of it).
Call = Callable[["ClaimedJob", dict[str, Any]], Any]


@dataclass(frozen=True, kw_only=True)
class Step:
    """A step around the handler call of every task it is ``wanted`` for.

    ``around(task, call)`` returns the call with the step around it, built once per task: for
    an async task (``task.is_async``) both are async and the step awaits ``call``; for a sync
    one both are plain and run on the handler's thread.
    """

    name: str
    wanted: Callable[[Task], bool]
    around: Callable[[Task, Call], Call]


def _open_secrets(task: Task, call: Call) -> Call:
    """The ``secrets`` step: the task's secret fields decrypted into the handler's arguments
    (:class:`~sqlqueue._secrets.SecretKeyMissing` when no key opens one), and their plaintext
    scrubbed from its result before that is stored (from what it gave ``ctx.set_result``
    too)."""
    secrets = task.secrets
    assert secrets is not None  # wanted only by tasks with secret fields
    context = task.context_parameter

    def scrub(kwargs: dict[str, Any], redactor: Redactor, returned: Any) -> Any:
        if context is not None and kwargs.get(context) is not None:
            kwargs[context].redact_result(redactor.value)
        return redactor.value(returned)

    if task.is_async:

        async def open_async(job: ClaimedJob, kwargs: dict[str, Any]) -> Any:
            opened, redactor = secrets.open(kwargs)
            return scrub(kwargs, redactor, await call(job, opened))

        return open_async

    def open_sync(job: ClaimedJob, kwargs: dict[str, Any]) -> Any:
        opened, redactor = secrets.open(kwargs)
        return scrub(kwargs, redactor, call(job, opened))

    return open_sync


def _middleware(task: Task, call: Call) -> Call:
    """The ``middleware`` step: the queue's middleware around the call, the first registered
    outermost (see sqlqueue/_middleware.py for where sync and async ones run)."""
    assert task.middlewares is not None  # wanted only by tasks of a queue with middleware
    return compose(task.middlewares.chain, call, is_async=task.is_async)


#: The extra steps around handler calls, outermost first; read when a task is made.
STEPS: tuple[Step, ...] = (
    # The attempt's consumer span, current while the handler runs (sqlqueue/_tracing.py): the
    # outermost, so that whatever the inner steps do happens in the attempt's trace.
    Step(name="trace", wanted=lambda task: task.tracing is not None, around=trace_step),
    # Handler calls begun, running and their duration, for a worker that serves Prometheus
    # metrics (sqlqueue/_worker/call_metrics.py): around the app's middleware, which is part
    # of the call (its errors are classified like the handler's).
    Step(name="metrics", wanted=metrics_wanted, around=metrics_step),
    # The app's middleware (@queue.middleware): inside the span, outside the decrypted secrets.
    Step(
        name="middleware",
        wanted=lambda task: task.middlewares is not None and bool(task.middlewares.chain),
        around=_middleware,
    ),
    Step(name="secrets", wanted=lambda task: task.secrets is not None, around=_open_secrets),
)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The steps an attempt of one task goes through, and its handler call composed with
    the extra ones."""

    steps: tuple[str, ...]
    #: Whether it needs no loop-side step: started on a handler thread, no asyncio task.
    direct: bool
    #: What the executor asks per attempt, as fields rather than a search of ``steps``:
    #: whether the gates are in, and the parameter the job's context goes to (if it is in).
    gates: bool
    context: str | None
    #: The handler with the extra steps around it.
    call: Call = field(repr=False)


def plan(task: Task) -> Plan:
    """The pipeline of ``task``'s attempts, from its handler and options."""
    extra = [step for step in STEPS if step.wanted(task)]
    loop_side = [
        name
        for name, wanted in (
            ("gates", task.rate_limit is not None or task.circuit_breaker is not None),
            ("context", task.context_parameter is not None),
            ("timeout", task.timeout is not None),
        )
        if wanted
    ]
    # Awaited in an asyncio task of its own (shutdown cancels it, a timeout abandons it)
    # whenever something runs on the loop around the handler, or the handler itself does.
    watch = ["watch"] if loop_side or task.is_async else []
    steps = (
        "arguments",
        *loop_side,
        *watch,
        "loop" if task.is_async else "thread",
        *(step.name for step in extra),
        "handler",
        "result",
        *(["transaction"] if task.context_parameter is not None else []),
    )
    call = _handler_call(task)
    for step in reversed(extra):
        call = step.around(task, call)
    return Plan(
        steps=steps,
        direct=not watch,
        gates="gates" in loop_side,
        context=task.context_parameter,
        call=call,
    )


def _handler_call(task: Task) -> Call:
    handler = task.handler

    def call(job: ClaimedJob, kwargs: dict[str, Any]) -> Any:
        return handler(**kwargs)

    return call
