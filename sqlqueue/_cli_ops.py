"""The operators' commands of ``sqlqueue``: stats, health, jobs, dead, cancel, prune, pause,
resume. Each builds a bare :class:`~sqlqueue.Queue` on the database URL (no app import) and calls
the same methods an app would; ``--json`` prints what those methods return."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlqueue._cli_text import (
    batch_details,
    handling,
    job_details,
    json_text,
    parse_duration,
    parse_moment,
    short,
    table,
)
from sqlqueue._errors import ConfigurationError, JobNotFound, JobStateError
from sqlqueue._job import Job, JobStatus
from sqlqueue._queue import Queue

__all__ = ["EXIT_ALARM", "add_commands"]

#: ``sqlqueue health`` found an alarm.
EXIT_ALARM = 1

Handler = Callable[[Queue, argparse.Namespace], int]


def add_commands(commands: Any, database_option: Callable[[argparse.ArgumentParser], None]) -> None:
    """Add the operators' subcommands to ``commands`` (an argparse subparsers object)."""

    def command(name: str, handler: Handler, help_text: str, parent: Any = commands) -> Any:
        parser = parent.add_parser(name, help=help_text, description=help_text)
        database_option(parser)
        parser.set_defaults(operate=handler)
        return parser

    stats = command("stats", _stats, "counts by status, queue and job type; top errors")
    _json_option(stats)

    health = command("health", _health, "check the alarms; exit 1 if any is raised")
    health.add_argument("--max-queued-age", default="5m", help="duration (default 5m)")
    health.add_argument("--max-dead-last-hour", type=int, default=10)
    health.add_argument("--max-same-error", type=int, default=20)
    _json_option(health)

    jobs = commands.add_parser("jobs", help="list or show jobs").add_subparsers(
        dest="jobs_command", required=True
    )
    jobs_list = command("list", _jobs_list, "list jobs, newest first", jobs)
    jobs_list.add_argument("--status", choices=[status.value for status in JobStatus])
    _filter_options(jobs_list)
    _page_options(jobs_list)
    jobs_show = command("show", _jobs_show, "show one job with its error history", jobs)
    jobs_show.add_argument("job_id", type=job_id)
    _json_option(jobs_show)

    batch = commands.add_parser("batch", help="show a batch").add_subparsers(
        dest="batch_command", required=True
    )
    batch_show = command("show", _batch_show, "show one batch: its counts by status", batch)
    batch_show.add_argument("batch_id", type=job_id)
    _json_option(batch_show)

    dead = commands.add_parser("dead", help="dead jobs: list, requeue, discard").add_subparsers(
        dest="dead_command", required=True
    )
    dead_list = command("list", _dead_list, "list dead jobs, newest first", dead)
    _filter_options(dead_list)
    dead_list.add_argument(
        "--unhandled", action="store_true", help="only those nobody requeued or discarded"
    )
    _page_options(dead_list)
    for name, handler, what in (
        ("requeue", _dead_requeue, "requeue matching dead jobs as new jobs"),
        ("discard", _dead_discard, "mark matching dead jobs handled without running them"),
    ):
        action = command(name, handler, what + " (those nobody requeued or discarded yet)", dead)
        _filter_options(action)
        action.add_argument("--ids", help="only these job ids, comma-separated")
        action.add_argument("--all", action="store_true", help="act on every dead job")
        action.add_argument("--limit", type=int, help="act on at most this many")
        action.add_argument("--by", required=True, help="who acts (recorded on each job)")
        action.add_argument("--reason", required=True, help="why (recorded on each job)")
        action.add_argument("--dry-run", action="store_true", help="show what would change")
        _json_option(action)

    cancel = command("cancel", _cancel, "cancel queued or failed jobs (running: ask to stop)")
    cancel.add_argument("job_ids", type=job_id, nargs="*", metavar="ID")
    cancel.add_argument("--type", dest="job_type")
    cancel.add_argument("--queue")
    cancel.add_argument("--group-key")
    cancel.add_argument("--dry-run", action="store_true", help="show what would change")
    _json_option(cancel)

    prune = command("prune", _prune, "delete finished jobs older than --older-than")
    prune.add_argument("--older-than", required=True, help="duration: 90s, 30m, 12h, 7d")
    prune.add_argument(
        "--status",
        dest="statuses",
        action="append",
        choices=["succeeded", "cancelled", "dead"],
        help="repeatable (default: succeeded and cancelled)",
    )
    prune.add_argument("--batch-size", type=int, default=1000)
    _json_option(prune)

    pause = command("pause", _pause, "stop workers claiming from a queue (running jobs finish)")
    pause.add_argument("queue_name", metavar="QUEUE")
    pause.add_argument("--by", required=True)
    pause.add_argument("--reason", required=True)
    resume = command("resume", _resume, "let workers claim from a paused queue again")
    resume.add_argument("queue_name", metavar="QUEUE")


def _json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")


def _filter_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--type", dest="job_type")
    parser.add_argument("--queue")
    parser.add_argument("--error-contains")
    parser.add_argument("--since", help="ISO 8601 time or a duration ago (2h): latest change")
    parser.add_argument("--until", help="ISO 8601 time or a duration ago (2h): latest change")


def _page_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--before-id", type=job_id, help="the page after this id (keyset paging)")
    _json_option(parser)


def _moments(queue: Queue, args: argparse.Namespace) -> tuple[datetime | None, datetime | None]:
    """``--since``/``--until`` as times; a duration counts back from the database clock."""
    if args.since is None and args.until is None:
        return None, None
    now = queue.database_now()
    since = None if args.since is None else parse_moment(args.since, option="--since", now=now)
    until = None if args.until is None else parse_moment(args.until, option="--until", now=now)
    return since, until


def _filters(queue: Queue, args: argparse.Namespace) -> dict[str, Any]:
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
        ]
        for name, q in stats.queues.items()
    ]
    rows.append(["(all)", *(stats.by_status[s] for s in statuses), None, ""])
    print(table(["queue", *statuses, "oldest due (s)", "paused"], rows))
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
    )
    if args.json:
        print(json_text(health.to_dict()))
    elif health.ok:
        print("healthy: no alarm")
    else:
        for alarm in health.alarms:
            print(f"ALARM {alarm.name}: {alarm.message}")
    return 0 if health.ok else EXIT_ALARM


def _print_jobs(jobs: list[Job], args: argparse.Namespace, *, dead: bool = False) -> None:
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
        status=args.status, limit=args.limit, before_id=args.before_id, **_filters(queue, args)
    )
    _print_jobs(jobs, args)
    return 0


def _jobs_show(queue: Queue, args: argparse.Namespace) -> int:
    job = queue.get_job(args.job_id)
    if job is None:
        raise JobNotFound(f"there is no job {args.job_id}")
    print(json_text(job.to_dict()) if args.json else job_details(job))
    return 0


def _batch_show(queue: Queue, args: argparse.Namespace) -> int:
    batch = queue.get_batch(args.batch_id)
    if batch is None:
        raise JobNotFound(f"there is no batch {args.batch_id}")
    print(json_text(batch.to_dict()) if args.json else batch_details(batch))
    return 0


def _dead_list(queue: Queue, args: argparse.Namespace) -> int:
    jobs = queue.jobs(
        status="dead",
        unhandled=args.unhandled,
        limit=args.limit,
        before_id=args.before_id,
        **_filters(queue, args),
    )
    _print_jobs(jobs, args, dead=True)
    return 0


# -- acting ----------------------------------------------------------------------------------


def _dead_action(queue: Queue, args: argparse.Namespace, verb: str) -> int:
    filters = _filters(queue, args)
    ids = _ids(args.ids)
    if not args.all and ids is None and not any(value is not None for value in filters.values()):
        raise ConfigurationError(
            f"refusing to {verb} every dead job: give a filter (--type, --queue, "
            "--error-contains, --since, --until, --ids) or --all"
        )
    if args.limit is not None and args.limit < 0:
        raise ConfigurationError(f"--limit must be >= 0, got {args.limit}")
    if args.dry_run:
        matching = _all_matching(queue, filters, ids, args.limit)
        if args.json:
            print(json_text({"dry_run": True, "would_" + verb: [job.id for job in matching]}))
        else:
            print(f"would {verb} {len(matching)} dead job(s):")
            if matching:
                print(
                    table(
                        ["id", "type", "queue", "died", "last error"],
                        [
                            [j.id, j.job_type, j.queue, j.finished_at, short(j.last_error)]
                            for j in matching
                        ],
                    )
                )
        return 0
    act = queue.requeue_where if verb == "requeue" else queue.discard_where
    done = act(by=args.by, reason=args.reason, job_ids=ids, limit=args.limit, **filters)
    past = "requeued" if verb == "requeue" else "discarded"
    if args.json:
        print(json_text({past: done}))
    elif verb == "requeue":
        print(f"requeued {len(done)} dead job(s) as new job(s): {_id_list(done)}")
    else:
        print(f"discarded {len(done)} dead job(s): {_id_list(done)}")
    return 0


def _dead_requeue(queue: Queue, args: argparse.Namespace) -> int:
    return _dead_action(queue, args, "requeue")


def _dead_discard(queue: Queue, args: argparse.Namespace) -> int:
    return _dead_action(queue, args, "discard")


def _all_matching(
    queue: Queue, filters: dict[str, Any], ids: list[int] | None, limit: int | None
) -> list[Job]:
    """The unhandled dead jobs an action would take: the oldest ``limit`` of them (it takes the
    oldest first), read newest first page by page."""
    return _every_job(queue, limit, status="dead", unhandled=True, job_ids=ids, **filters)


def _every_job(source: Queue, limit: int | None, /, **filters: Any) -> list[Job]:
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


def _cancel(queue: Queue, args: argparse.Namespace) -> int:
    by_filter = args.job_type is not None or args.queue is not None or args.group_key is not None
    if not args.job_ids and not by_filter:
        raise ConfigurationError("cancel needs job ids or a filter (--type, --queue, --group-key)")
    if args.job_ids and by_filter:
        raise ConfigurationError("cancel takes job ids or a filter, not both")
    if args.dry_run:
        if args.job_ids:
            found = [queue.get_job(job_id) for job_id in args.job_ids]
            jobs = [job for job in found if job is not None]
        else:
            where = {"job_type": args.job_type, "queue": args.queue, "group_key": args.group_key}
            jobs = [
                job
                for status in ("queued", "failed", "running")
                for job in _every_job(queue, None, status=status, **where)
            ]
        print(
            json_text({"dry_run": True, "would_cancel": [j.id for j in jobs]})
            if args.json
            else f"would cancel {len(jobs)} job(s): {_id_list([j.id for j in jobs])}"
        )
        return 0
    if args.job_ids:
        return _cancel_each(queue, args.job_ids, as_json=args.json)
    count = queue.cancel_where(job_type=args.job_type, queue=args.queue, group_key=args.group_key)
    print(json_text({"cancelled": count}) if args.json else f"cancelled {count} job(s)")
    return 0


def _cancel_each(queue: Queue, job_ids: list[int], *, as_json: bool) -> int:
    """Cancel each job on its own, saying what became of every one; exit 1 if any could not
    be cancelled (not there, or already finished) — the others are cancelled all the same."""
    outcomes: list[dict[str, Any]] = []
    for job_id in job_ids:
        try:
            job = queue.cancel(job_id)
        except JobStateError as error:  # JobNotFound included
            outcomes.append({"id": job_id, "error": str(error)})
            continue
        state = "stop requested" if job.status == JobStatus.RUNNING else job.status.value
        outcomes.append({"id": job_id, "status": state})
    if as_json:
        print(json_text({"jobs": outcomes}))
    else:
        for outcome in outcomes:
            print(f"job {outcome['id']}: {outcome.get('status') or 'error: ' + outcome['error']}")
    return EXIT_ALARM if any("error" in outcome for outcome in outcomes) else 0


def _prune(queue: Queue, args: argparse.Namespace) -> int:
    older_than = parse_duration(args.older_than, option="--older-than")
    statuses = args.statuses or ["succeeded", "cancelled"]
    deleted = queue.prune(older_than=older_than, statuses=statuses, batch_size=args.batch_size)
    if args.json:
        print(
            json_text({"deleted": deleted, "statuses": statuses, "older_than_seconds": older_than})
        )
    else:
        print(f"deleted {deleted} {'/'.join(statuses)} job(s) finished over {args.older_than} ago")
    return 0


def _pause(queue: Queue, args: argparse.Namespace) -> int:
    queue.pause(args.queue_name, by=args.by, reason=args.reason)
    print(f"queue {args.queue_name!r} paused: workers stop claiming from it")
    return 0


def _resume(queue: Queue, args: argparse.Namespace) -> int:
    was_paused = queue.resume(args.queue_name)
    print(
        f"queue {args.queue_name!r} resumed"
        if was_paused
        else f"queue {args.queue_name!r} was not paused"
    )
    return 0


def _ids(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [job_id(part) for part in text.split(",") if part.strip()]
    except argparse.ArgumentTypeError:
        raise ConfigurationError(f"--ids: expected comma-separated job ids, got {text!r}") from None


#: Job ids are 64-bit signed integers on every backend.
MAX_JOB_ID = 2**63 - 1


def job_id(text: str) -> int:
    """A job id from the command line (argparse makes a bad one a usage error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a job id, got {text!r}") from None
    if not 1 <= value <= MAX_JOB_ID:
        raise argparse.ArgumentTypeError(f"a job id is between 1 and {MAX_JOB_ID}, got {value}")
    return value


def _id_list(ids: list[int], shown: int = 20) -> str:
    text = ", ".join(str(job_id) for job_id in ids[:shown])
    return text + (f" … (+{len(ids) - shown})" if len(ids) > shown else "") if ids else "none"
