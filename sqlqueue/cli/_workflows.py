"""``sqlqueue workflow show ID``: a workflow's steps in topological order with each step's
status, attempts and last error; and the line naming a job's workflow and step that
``sqlqueue jobs show`` prints."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlqueue._errors import JobNotFound
from sqlqueue._job import Job
from sqlqueue._workflow import WorkflowStatus
from sqlqueue.cli._text import json_text, short, table

if TYPE_CHECKING:  # the parser loads this module: no SQLAlchemy before a command runs
    from sqlqueue._queue import Queue

__all__ = ["add_workflow_commands", "workflow_of"]


def add_workflow_commands(
    commands: Any,
    command: Callable[..., Any],
    workflow_id: Callable[[str], int],
    json_option: Callable[[argparse.ArgumentParser], None],
) -> None:
    """Add ``workflow show`` to ``commands`` (``command`` builds a subcommand's parser,
    ``workflow_id`` parses its id)."""
    workflow = commands.add_parser("workflow", help="show a workflow").add_subparsers(
        dest="workflow_command", required=True
    )
    show = command(
        "show", _workflow_show, "show one workflow: its steps in topological order", workflow
    )
    show.add_argument("workflow_id", type=workflow_id, metavar="ID", help="the workflow's id")
    json_option(show)


def _workflow_show(queue: Queue, args: argparse.Namespace) -> int:
    status = queue.get_workflow(args.workflow_id)
    if status is None:
        raise JobNotFound(f"there is no workflow {args.workflow_id}")
    ids = [step.job_id for step in status.steps.values()]
    found = {job.id: job for job in _jobs(queue, ids)}
    if args.json:
        document = status.to_dict()
        for name, step in status.steps.items():
            job = found.get(step.job_id)
            document["steps"][name]["attempts"] = None if job is None else job.attempts
            document["steps"][name]["last_error"] = None if job is None else job.last_error
        print(json_text(document))
        return 0
    finished = "-" if status.finished_at is None else status.finished_at.isoformat()
    print(f"workflow {status.id} (on_dead={status.on_dead}), finished: {finished}")
    if status.blocked_by:
        print(f"blocked by: {', '.join(status.blocked_by)}")
    rows = []
    for name, step in status.steps.items():
        job = found.get(step.job_id)
        rows.append(
            [
                name,
                step.job_id,
                step.status.value,
                "-" if job is None else job.attempts,
                ", ".join(step.after) or "-",
                short(None if job is None else job.last_error),
            ]
        )
    print(table(["step", "job", "status", "attempts", "after", "last error"], rows))
    return 0


def _jobs(queue: Queue, ids: list[int]) -> list[Job]:
    """The jobs with ``ids``, a page of a thousand at a time."""
    found: list[Job] = []
    for start in range(0, len(ids), 1000):
        chunk = ids[start : start + 1000]
        found += queue.jobs(job_ids=chunk, limit=len(chunk))
    return found


#: How many requeues :func:`workflow_of` follows from a replaced step's job to its current one.
MAX_REQUEUES = 100


def workflow_of(queue: Queue, job: Job) -> tuple[WorkflowStatus, str, int | None] | None:
    """The workflow job ``job`` is a step of, the step's name, and the job that took its place
    there when it was requeued (``None``: it is the step's current job); ``None`` outside a
    workflow. A requeued dead step's old job is no step's current job any more: its
    ``requeued_as`` chain leads to the one that is."""
    if job.batch_id is None:
        return None
    status = queue.get_workflow(job.batch_id)
    if status is None:
        return None
    by_job = {step.job_id: name for name, step in status.steps.items()}
    current: Job | None = job
    for _ in range(MAX_REQUEUES + 1):
        if current is None:
            return None
        if current.id in by_job:
            return status, by_job[current.id], None if current.id == job.id else current.id
        if current.requeued_as is None:
            return None
        current = queue.get_job(current.requeued_as)
    return None
