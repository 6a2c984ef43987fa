"""Writing a workflow: every step checked as any enqueue checks a job, and the graph checked,
before any SQL; then the workflow's row, its steps (through the bulk insert path, like a
batch's children), their edges and waiting statuses, in the caller's transaction."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlqueue._enqueue import EnqueueSettings, Executable, build_row, to_connection
from sqlqueue._errors import WorkflowError
from sqlqueue._jobrow import JobRow
from sqlqueue._store.batches import create_batch
from sqlqueue._store.transactions import translated
from sqlqueue._store.workflows import create_steps
from sqlqueue._task import JobRequest
from sqlqueue._workflow import Workflow, WorkflowHandle

__all__ = ["check_step", "check_workflow", "enqueue_workflow"]

#: The producer span around a write (``Tracing.send``), when tracing is on.
Send = Callable[[Sequence[JobRow], Callable[[], list[int]]], list[int]]


def check_workflow(
    settings: EnqueueSettings, workflow: object
) -> tuple[list[str], list[JobRow], Workflow]:
    """The step names in topological order and their checked rows; :class:`WorkflowError` (or
    the enqueue error of a bad step) before any SQL."""
    if not isinstance(workflow, Workflow):
        raise WorkflowError(f"expected a sqlqueue.Workflow, got {type(workflow).__name__}")
    names = workflow.order()
    requests = workflow.steps
    rows = [check_step(settings, name, requests[name]) for name in names]
    return names, rows, workflow


def check_step(settings: EnqueueSettings, name: str, request: object) -> JobRow:
    """The checked row of step ``name`` (as any enqueue checks a job), before any SQL;
    :class:`WorkflowError` for a step that cannot be one: not a request, or one with an
    idempotency key or a unique key, which enqueue may answer with an existing job that is
    not this workflow's step (the steps after it would then wait on a stranger)."""
    if not isinstance(request, JobRequest):
        kind = type(request).__name__
        raise WorkflowError(f"step {name!r} must be a sqlqueue.JobRequest, got {kind}")
    row = build_row(settings, request)
    if row["idempotency_key"] is not None:  # an on_enqueue hook gave it one
        raise WorkflowError(f"step {name!r} has an idempotency_key: steps cannot have one")
    if row["unique_key"] is not None:
        raise WorkflowError(
            f"step {name!r} ({row['job_type']}) is unique (sqlqueue.Unique): a unique job cannot "
            "be a workflow step (an existing job holding its key would stand in for it, and is "
            "not this workflow's); enqueue it outside the workflow (a step may enqueue it in "
            "ctx.transaction()), or use a task without unique="
        )
    return row


def enqueue_workflow(
    settings: EnqueueSettings, target: Executable, workflow: Workflow, send: Send | None = None
) -> WorkflowHandle:
    """Write ``workflow`` in the caller's transaction (``Connection``, ``Session`` or an
    ``Engine`` for a transaction of its own); return its id and each step's job id."""
    names, rows, checked = check_workflow(settings, workflow)
    dialect = settings.dialect
    after = checked.after
    written: list[WorkflowHandle] = []

    def write() -> list[int]:
        with to_connection(target) as conn:
            dialect.check_connection(conn)
            workflow_id, ids = create_batch(
                conn,
                dialect,
                children=rows,
                on_complete=None,
                on_dead=None,
                workflow_on_dead=checked.on_dead,
            )
            create_steps(conn, dialect, workflow_id, names=names, job_ids=ids, after=after)
        written.append(WorkflowHandle(id=workflow_id, job_ids=dict(zip(names, ids, strict=True))))
        return ids

    def translated_write() -> list[int]:
        result: list[int] = translated(dialect, write)
        return result

    if send is None:
        translated_write()
    else:
        send(rows, translated_write)
    return written[0]
