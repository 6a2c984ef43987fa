"""What a workflow step's handler reads and writes through its context: the results of the
steps it runs after, and steps it adds to its workflow (``ctx.upstream_results``,
``ctx.add_to_workflow``). Kept apart from :mod:`sqlqueue._context`, which only forwards."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from sqlqueue._errors import JobStateError, WorkflowError
from sqlqueue._jobrow import JobRow
from sqlqueue._store import workflow_reads, workflows
from sqlqueue._store.transactions import in_read, translated
from sqlqueue._workflow import check_step_name

if TYPE_CHECKING:
    from sqlqueue._context import JobContext, JobDatabase
    from sqlqueue._task import JobRequest

__all__ = ["check_added_step", "read_upstream_results", "write_added_step"]


def read_upstream_results(database: JobDatabase, job_id: int) -> dict[str, Any]:
    """The results of the direct upstream steps of job ``job_id`` that succeeded, by name."""

    return in_read(
        database.engine,
        database.dialect,
        lambda conn: workflow_reads.upstream_results(conn, job_id),
    )


def check_added_step(
    ctx: JobContext, name: str, request: JobRequest, after: Iterable[str]
) -> tuple[int, tuple[str, ...], JobRow]:
    """The workflow id, upstream names and checked row of a step ``ctx`` adds, before any SQL
    (:class:`WorkflowError` for a bad name, :class:`JobStateError` outside a workflow)."""
    workflow_id = ctx._job.batch_id
    if workflow_id is None:
        raise JobStateError(
            f"job {ctx.job_id} ({ctx.job_type}) is not a workflow step: add_to_workflow adds "
            "steps to the workflow of a running step; use queue.enqueue_workflow to start one"
        )
    check_step_name(name)
    if isinstance(after, str):
        raise WorkflowError(f"step {name!r}: after must be a list of step names, not a str")
    upstream = tuple(check_step_name(step) for step in after)
    if len(set(upstream)) != len(upstream) or name in upstream:
        raise WorkflowError(f"step {name!r}: after={upstream!r} repeats a step or names itself")
    if getattr(request, "idempotency_key", None) is not None:
        raise WorkflowError(f"step {name!r} has an idempotency_key: steps cannot have one")
    return workflow_id, upstream, ctx._database._workflow_row(name, request)


def write_added_step(
    ctx: JobContext,
    conn: Connection,
    workflow_id: int,
    name: str,
    row: JobRow,
    after: tuple[str, ...],
) -> int:
    """Write the step in ``conn`` (the step's completing transaction); :class:`JobStateError`
    saying why it cannot be added (nothing is written then)."""
    dialect = ctx._database.dialect
    try:
        return translated(
            dialect,
            lambda: workflows.add_step(conn, dialect, workflow_id, name=name, row=row, after=after),
        )
    except LookupError as error:
        raise JobStateError(f"cannot add step {name!r}: {error.args[0]}") from None
