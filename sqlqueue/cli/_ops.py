"""The operators' reading commands of ``sqlqueue`` (stats, health, jobs, batch, workflow), and
what the acting ones (``_act``) share with them: options, filters, job ids. Each builds a bare
:class:`~sqlqueue.Queue` on the database URL (no app import) and calls the same methods an app
would; ``--json`` prints what those methods return."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlqueue._errors import ConfigurationError, JobNotFound
from sqlqueue._job import Job, JobStatus
from sqlqueue.cli._text import (
    batch_details,
    handling,
    job_details,
    json_text,
    parse_duration,
    parse_moment,
    short,
    table,
)
from sqlqueue.cli._workers import worker_of, worker_text
from sqlqueue.cli._workflows import add_workflow_commands, workflow_of

if TYPE_CHECKING:  # the parser loads this module: no SQLAlchemy before a command runs
    from sqlqueue._queue import Queue

__all__ = [
    "EXIT_ALARM",
    "add_commands",
    "every_job",
    "filter_options",
    "filters_of",
    "id_list",
    "job_id",
    "json_option",
    "page_options",
    "parse_ids",
    "print_jobs",
]

#: ``sqlqueue health`` found an alarm.
EXIT_ALARM = 1

Handler = Callable[["Queue", argparse.Namespace], int]


def add_commands(commands: Any, database_option: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the operators' subcommands to ``commands`` (an argparse subparsers object)."""

    def command(name: str, handler: Handler, help_text: str, parent: Any = commands) -> Any:
        parser = parent.add_parser(name, help=help_text, description=help_text)
        database_option(parser)
        parser.set_defaults(operate=handler)
        return parser

    stats = command("stats", _stats, "counts by status, queue and job type; top errors")
    json_option(stats)

    health = command("health", _health, "check the alarms; exit 1 if any is raised")
    health.add_argument("--max-queued-age", default="5m", help="duration (default 5m)")
    health.add_argument(
        "--max-dead-last-hour",
        type=int,
        default=10,
        help="jobs that died in the last hour, nobody requeued or discarded (default 10)",
    )
    health.add_argument(
        "--max-same-error",
        type=int,
        default=20,
        help="failed or dead jobs sharing one error text (default 20)",
    )
    health.add_argument(
        "--max-unserved",
        default="5m",
        help="duration a queue may have due jobs and no live worker (default 5m)",
    )
    json_option(health)

    jobs = commands.add_parser("jobs", help="list or show jobs").add_subparsers(
        dest="jobs_command", required=True
    )
    jobs_list = command("list", _jobs_list, "list jobs, newest first", jobs)
    jobs_list.add_argument(
        "--status", choices=[status.value for status in JobStatus], help="only jobs in this state"
    )
    filter_options(jobs_list)
    jobs_list.add_argument("--tag", help="only jobs with this tag")
    page_options(jobs_list)
    jobs_show = command("show", _jobs_show, "show one job with its error history", jobs)
    jobs_show.add_argument("job_id", type=job_id, metavar="ID", help="the job's id")
    json_option(jobs_show)

    batch = commands.add_parser("batch", help="show a batch").add_subparsers(
        dest="batch_command", required=True
    )
    batch_show = command("show", _batch_show, "show one batch: its counts by status", batch)
    batch_show.add_argument("batch_id", type=row_id("batch"), metavar="ID", help="the batch's id")
    json_option(batch_show)
    add_workflow_commands(commands, command, row_id("workflow"), json_option)


def json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def filter_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--type", dest="job_type", help="only jobs of this job type")
    parser.add_argument("--queue", help="only jobs of this queue")
    parser.add_argument("--error-contains", help="only jobs whose last error holds this text")
    parser.add_argument("--since", help="ISO 8601 time or a duration ago (2h): latest change")
    parser.add_argument("--until", help="ISO 8601 time or a duration ago (2h): latest change")


def page_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=50, help="jobs per page (default 50)")
    parser.add_argument("--before-id", type=job_id, help="the page after this id (keyset paging)")
    json_option(parser)


def _moments(queue: Queue, args: argparse.Namespace) -> tuple[datetime | None, datetime | None]:
    """``--since``/``--until`` as times; a duration counts back from the database clock."""
    if args.since is None and args.until is None:
        return None, None
    now = queue.database_now()
    since = None if args.since is None else parse_moment(args.since, option="--since", now=now)
    until = None if args.until is None else parse_moment(args.until, option="--until", now=now)
    return since, until


def filters_of(queue: Queue, args: argparse.Namespace) -> dict[str, Any]:
    since, until = _moments(queue, args)
    return {  # an empty value ("$VAR" unset) filters nothing: it must not pass for a filter
        "job_type": args.job_type or None,
        "queue": args.queue or None,
        "error_contains": args.error_contains or None,
        "since": since,
        "until": until,
    }


# -- reading ---------------------------------------------------------------------------------


def _stats(queue: Queue, args: argparse.Namespace) -> int:
    stats = queue.stats()
    if args.json:
        print(json_text(stats.to_dict()))
        return 0
    statuses = [status.value for status in JobStatus]
    rows = [
        [
            name,
            *(q.by_status[s] for s in statuses),
            q.oldest_queued_age_seconds,
            "yes" if q.paused else "",
            "" if q.max_running is None else q.max_running,
        ]
        for name, q in stats.queues.items()
    ]
    rows.append(["(all)", *(stats.by_status[s] for s in statuses), None, "", ""])
    print(table(["queue", *statuses, "oldest due (s)", "paused", "limit"], rows))
    print()
    types = [[name, *(counts[s] for s in statuses)] for name, counts in stats.job_types.items()]
    print(table(["job type", *statuses], types))
    print()
    print(f"failed in the last hour: {stats.failed_last_hour}")
    print(f"dead in the last hour (unhandled): {stats.dead_last_hour}")
    if stats.top_errors:
        print()
        print(
            table(
                ["count", "top errors"], [[e.count, short(e.error, 90)] for e in stats.top_errors]
            )
        )
    return 0


def _health(queue: Queue, args: argparse.Namespace) -> int:
    health = queue.health(
        max_queued_age=parse_duration(args.max_queued_age, option="--max-queued-age"),
        max_dead_last_hour=args.max_dead_last_hour,
        max_same_error=args.max_same_error,
        max_unserved=parse_duration(args.max_unserved, option="--max-unserved"),
    )
    if args.json:
        print(json_text(health.to_dict()))
    elif health.ok:
        print("healthy: no alarm")
    else:
        for alarm in health.alarms:
            print(f"ALARM {alarm.name}: {alarm.message}")
    return 0 if health.ok else EXIT_ALARM


def print_jobs(jobs: list[Job], args: argparse.Namespace, *, dead: bool = False) -> None:
    if args.json:
        print(json_text([job.to_dict() for job in jobs]))
        return
    if dead:
        headers = ["id", "type", "queue", "attempts", "died", "handled", "last error"]
        rows = [
            [j.id, j.job_type, j.queue, j.attempts, j.finished_at, handling(j), short(j.last_error)]
            for j in jobs
        ]
    else:
        headers = ["id", "type", "queue", "status", "attempts", "next run", "last error"]
        rows = [
            [
                j.id,
                j.job_type,
                j.queue,
                j.status.value,
                j.attempts,
                j.next_run_at,
                short(j.last_error),
            ]
            for j in jobs
        ]
    print(table(headers, rows))
    if jobs and len(jobs) == args.limit:
        print(f"(more: --before-id {jobs[-1].id})")


def _jobs_list(queue: Queue, args: argparse.Namespace) -> int:
    jobs = queue.jobs(
        status=args.status,
        limit=args.limit,
        before_id=args.before_id,
        tag=args.tag,
        **filters_of(queue, args),
    )
    print_jobs(jobs, args)
    return 0


def _jobs_show(queue: Queue, args: argparse.Namespace) -> int:
    job = queue.get_job(args.job_id)
    if job is None:
        raise JobNotFound(f"there is no job {args.job_id}")
    worker = worker_of(queue, job)
    actions = queue.job_actions(job.id)
    step = workflow_of(queue, job)
    if args.json:
        document = {**job.to_dict(), "worker": None if worker is None else worker.to_dict()}
        document["workflow"] = (
            None if step is None else {"id": step[0].id, "step": step[1], "replaced_by": step[2]}
        )
        print(json_text({**document, "actions": [action.to_dict() for action in actions]}))
    else:
        print(job_details(job, worker=worker_text(job, worker), actions=actions))
        if step is not None:
            replaced = "" if step[2] is None else f", replaced there by job {step[2]}"
            print(
                f"{'workflow:':17} {step[0].id}, step {step[1]!r}{replaced} "
                "(sqlqueue workflow show)"
            )
    return 0


def _batch_show(queue: Queue, args: argparse.Namespace) -> int:
    batch = queue.get_batch(args.batch_id)
    if batch is None:
        raise JobNotFound(f"there is no batch {args.batch_id}")
    print(json_text(batch.to_dict()) if args.json else batch_details(batch))
    return 0


def every_job(source: Queue, limit: int | None, /, **filters: Any) -> list[Job]:
    """Every job matching ``filters`` (``queue`` among them), oldest first (at most the oldest
    ``limit``)."""
    found: list[Job] = []
    before: int | None = None
    while True:
        page = source.jobs(limit=1000, before_id=before, **filters)
        found.extend(page)
        if len(page) < 1000:
            break
        before = page[-1].id
    found.reverse()
    return found if limit is None else found[:limit]


def parse_ids(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [job_id(part) for part in text.split(",") if part.strip()]
    except argparse.ArgumentTypeError:
        raise ConfigurationError(f"--ids: expected comma-separated job ids, got {text!r}") from None


#: Job, batch and workflow ids are 64-bit signed integers on every backend.
MAX_JOB_ID = 2**63 - 1


def row_id(kind: str) -> Callable[[str], int]:
    """An argparse ``type`` for the id of a ``kind`` (``"batch"``, ``"workflow"``): a bad one
    is a usage error that names what the command wanted, not a job id."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind} id, got {text!r}") from None
        if not 1 <= value <= MAX_JOB_ID:
            raise argparse.ArgumentTypeError(
                f"a {kind} id is between 1 and {MAX_JOB_ID}, got {value}"
            )
        return value

    return parse


_job_id = row_id("job")


def job_id(text: str) -> int:
    """A job id from the command line (argparse makes a bad one a usage error)."""
    return _job_id(text)


def id_list(ids: list[int], shown: int = 20) -> str:
    text = ", ".join(str(job_id) for job_id in ids[:shown])
    return text + (f" … (+{len(ids) - shown})" if len(ids) > shown else "") if ids else "none"
