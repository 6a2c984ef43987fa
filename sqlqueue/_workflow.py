"""Workflows as the public API sees them: the graph a caller builds (:class:`Workflow`), the
handle :meth:`Queue.enqueue_workflow` returns, and a frozen snapshot of a workflow's steps
(:meth:`Queue.get_workflow`, ``ctx.workflow``).

A workflow is a batch whose children wait for each other: a step with upstream steps is stored
``waiting`` and becomes ``queued`` in the transaction that ends its last upstream. The graph is
checked here, in memory, before any SQL (:class:`WorkflowError`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlqueue._errors import WorkflowError
from sqlqueue._job import TERMINAL, JobStatus

__all__ = [
    "MAX_STEP_NAME",
    "ON_DEAD",
    "StepStatus",
    "Workflow",
    "WorkflowHandle",
    "WorkflowStatus",
    "check_step_name",
    "topological_order",
]

#: What a dead (or cancelled) step does to the steps after it.
ON_DEAD: tuple[str, ...] = ("wait", "cancel", "run")
#: The longest step name (the ``name`` column of ``sqlqueue_workflow_steps``).
MAX_STEP_NAME = 200

OnDead = Literal["wait", "cancel", "run"]


def check_step_name(name: object) -> str:
    """``name`` if it is a usable step name, else :class:`WorkflowError`."""
    if not isinstance(name, str) or not name or len(name) > MAX_STEP_NAME:
        raise WorkflowError(
            f"a step name must be a non-empty str of at most {MAX_STEP_NAME} characters, "
            f"got {name!r}"
        )
    if name != name.strip() or "\x00" in name:
        raise WorkflowError(f"step name {name!r} has surrounding blanks or a NUL character")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError as bad:  # a lone surrogate: no database stores it
        raise WorkflowError(
            f"step name {name!r} is not valid Unicode: a lone surrogate at position {bad.start}"
        ) from None
    return name


def _check_after(name: str, after: object) -> tuple[str, ...]:
    if isinstance(after, str) or not isinstance(after, Iterable):
        raise WorkflowError(
            f"step {name!r}: after must be a list of step names, got {type(after).__name__}"
        )
    names = tuple(after)
    for upstream in names:
        check_step_name(upstream)
    if len(set(names)) != len(names):
        raise WorkflowError(f"step {name!r} names an upstream step twice in after={names!r}")
    if name in names:
        raise WorkflowError(f"step {name!r} cannot run after itself")
    return names


def topological_order(after: Mapping[str, tuple[str, ...]]) -> list[str]:
    """The step names so that each comes after all its upstreams (ties in insertion order);
    :class:`WorkflowError` naming an unknown upstream or the steps of a cycle."""
    for name, upstreams in after.items():
        for upstream in upstreams:
            if upstream not in after:
                raise WorkflowError(f"step {name!r} runs after {upstream!r}, which is no step")
    remaining = {name: len(upstreams) for name, upstreams in after.items()}
    downstream: dict[str, list[str]] = {name: [] for name in after}
    for name, upstreams in after.items():
        for upstream in upstreams:
            downstream[upstream].append(name)
    ready = deque(name for name, count in remaining.items() if count == 0)
    order: list[str] = []
    while ready:
        name = ready.popleft()
        order.append(name)
        for child in downstream[name]:
            remaining[child] -= 1
            if remaining[child] == 0:
                ready.append(child)
    if len(order) < len(after):
        stuck = sorted(name for name, count in remaining.items() if count > 0)
        raise WorkflowError(f"the steps {', '.join(map(repr, stuck[:10]))} form a cycle")
    return order


class Workflow:
    """A graph of jobs to enqueue in one call: each step a :class:`JobRequest` with a unique
    name, running after the steps named in its ``after``.

    ``on_dead`` says what a dead (or cancelled) step does to the steps after it: ``"wait"``
    (they stay ``waiting`` until the dead step is requeued and succeeds), ``"cancel"`` (every
    step after it, transitively, is cancelled at once) or ``"run"`` (they run without its
    result).
    """

    def __init__(self, *, on_dead: OnDead = "wait") -> None:
        if on_dead not in ON_DEAD:
            raise WorkflowError(f"on_dead must be one of {', '.join(ON_DEAD)}, got {on_dead!r}")
        self.on_dead: str = on_dead
        self._requests: dict[str, Any] = {}  # sqlqueue.JobRequest, checked when enqueued
        self._after: dict[str, tuple[str, ...]] = {}

    def add(self, name: str, request: Any, *, after: Iterable[str] = ()) -> str:
        """Add step ``name`` running ``request`` (a :class:`sqlqueue.JobRequest`) after the steps
        in ``after``; return ``name``. Upstream steps may be added later: the graph is checked
        when it is enqueued, and so is each request (above this module's layer)."""
        check_step_name(name)
        if name in self._requests:
            raise WorkflowError(f"step {name!r} is already in this workflow")
        if getattr(request, "idempotency_key", None) is not None:
            raise WorkflowError(
                f"step {name!r} has an idempotency_key: a workflow's steps cannot have one (an "
                "existing job with that key is not this workflow's step)"
            )
        if getattr(request, "unique", None) is not None:
            raise WorkflowError(
                f"step {name!r} is unique (unique=sqlqueue.Unique(...)): a unique job cannot be "
                "a workflow step (an existing job holding its key would stand in for it, and is "
                "not this workflow's); enqueue it outside the workflow"
            )
        self._after[name] = _check_after(name, after)
        self._requests[name] = request
        return name

    @property
    def steps(self) -> Mapping[str, Any]:
        """The steps added so far, by name."""
        return dict(self._requests)

    @property
    def after(self) -> Mapping[str, tuple[str, ...]]:
        """Each step's upstream step names."""
        return dict(self._after)

    def order(self) -> list[str]:
        """The step names in a topological order; :class:`WorkflowError` for an empty
        workflow, an unknown upstream or a cycle."""
        if not self._requests:
            raise WorkflowError("a workflow needs at least one step (wf.add(...))")
        return topological_order(self._after)


@dataclass(frozen=True, kw_only=True)
class WorkflowHandle:
    """A workflow just written: its id and each step's job id."""

    id: int
    job_ids: dict[str, int]


@dataclass(frozen=True, kw_only=True)
class StepStatus:
    """One step: its current job (a requeued step's new job), that job's status, the steps it
    runs after, and whether its job stored a result."""

    job_id: int
    status: JobStatus
    after: tuple[str, ...]
    result_available: bool


@dataclass(frozen=True, kw_only=True)
class WorkflowStatus:
    """Where a workflow is: its steps by name (in topological order) and ``counts`` by status
    (every :class:`JobStatus`); ``finished_at`` once every step ended."""

    id: int
    on_dead: str
    created_at: datetime
    finished_at: datetime | None
    steps: Mapping[str, StepStatus]
    counts: Mapping[JobStatus, int]

    @property
    def finished(self) -> bool:
        """Whether every step's job has ended (succeeded, dead or cancelled)."""
        return all(step.status in TERMINAL for step in self.steps.values())

    @property
    def succeeded(self) -> bool:
        """Whether every step succeeded."""
        return all(step.status is JobStatus.SUCCEEDED for step in self.steps.values())

    @property
    def blocked_by(self) -> tuple[str, ...]:
        """The dead or cancelled steps that hold steps ``waiting`` (under ``on_dead="wait"``;
        under ``"run"`` a dead step holds nothing up, under ``"cancel"`` nothing waits after
        it)."""
        if self.on_dead != "wait":
            return ()
        waiting = {name for name, step in self.steps.items() if step.status is JobStatus.WAITING}
        ended = (JobStatus.DEAD, JobStatus.CANCELLED)
        return tuple(
            name
            for name, step in self.steps.items()
            if step.status in ended and any(name in self.steps[other].after for other in waiting)
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values: statuses by name, times in ISO 8601."""
        return {
            "id": self.id,
            "on_dead": self.on_dead,
            "created_at": self.created_at.isoformat(),
            "finished_at": None if self.finished_at is None else self.finished_at.isoformat(),
            "finished": self.finished,
            "succeeded": self.succeeded,
            "blocked_by": list(self.blocked_by),
            "counts": {status.value: count for status, count in self.counts.items()},
            "steps": {
                name: {
                    "job_id": step.job_id,
                    "status": step.status.value,
                    "after": list(step.after),
                    "result_available": step.result_available,
                }
                for name, step in self.steps.items()
            },
        }
