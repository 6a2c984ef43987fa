"""The acting commands of ``sqlqueue``: dead (list, requeue, discard), cancel, run-now,
reschedule, prune, pause, resume and limit. Like the reading ones (``_ops``), each builds a bare
:class:`~sqlqueue.Queue` on the database URL and calls what an app would; ``--json`` prints
what those calls return.

Given job ids, ``dead requeue``/``dead discard`` and ``cancel`` act on each job on their own
and say what became of every one (exit 1 if any could not be acted on, as the API raises);
given filters they act on every matching job that is still unhandled.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlqueue._digits import ascii_number
from sqlqueue._errors import ConfigurationError, JobStateError
from sqlqueue._job import Job, JobStatus
from sqlqueue._operators.moments import parse_run_time
from sqlqueue.cli._ops import (
    EXIT_ALARM,
    every_job,
    filter_options,
    filters_of,
    id_list,
    job_id,
    json_option,
    page_options,
    parse_ids,
    print_jobs,
)
from sqlqueue.cli._text import json_text, parse_duration, short, spoken_duration, table

if TYPE_CHECKING:  # the parser loads this module: no SQLAlchemy before a command runs
    from sqlqueue._queue import Queue

__all__ = ["add_acting_commands"]

Handler = Callable[["Queue", argparse.Namespace], int]


def add_acting_commands(
    commands: Any, database_option: Callable[[argparse.ArgumentParser], None]
) -> None:
    """Add the acting subcommands to ``commands`` (an argparse subparsers object)."""

    def command(name: str, handler: Handler, help_text: str, parent: Any = commands) -> Any:
        parser = parent.add_parser(name, help=help_text, description=help_text)
        database_option(parser)
        parser.set_defaults(operate=handler)
        return parser

    dead = commands.add_parser("dead", help="dead jobs: list, requeue, discard").add_subparsers(
        dest="dead_command", required=True
    )
    dead_list = command("list", _dead_list, "list dead jobs, newest first", dead)
    filter_options(dead_list)
    dead_list.add_argument(
        "--unhandled", action="store_true", help="only those nobody requeued or discarded"
    )
    page_options(dead_list)
    for name, handler, what in (
        ("requeue", _dead_requeue, "requeue dead jobs as new jobs"),
        ("discard", _dead_discard, "mark dead jobs handled without running them"),
    ):
        action = command(
            name,
            handler,
            f"{what}: the jobs ID… (each on its own), or every matching one nobody requeued "
            "or discarded yet",
            dead,
        )
        action.add_argument("job_ids", type=job_id, nargs="*", metavar="ID", help="dead jobs' ids")
        filter_options(action)
        action.add_argument("--ids", help="only these job ids, comma-separated")
        action.add_argument("--all", action="store_true", help="act on every dead job")
        action.add_argument("--limit", type=int, help="act on at most this many")
        action.add_argument("--by", help="who acts (recorded on each job; not for --dry-run)")
        action.add_argument("--reason", help="why (recorded on each job; not for --dry-run)")
        action.add_argument("--dry-run", action="store_true", help="show what would change")
        json_option(action)

    cancel = command("cancel", _cancel, "cancel queued or failed jobs (running: ask to stop)")
    cancel.add_argument("job_ids", type=job_id, nargs="*", metavar="ID", help="the jobs' ids")
    cancel.add_argument("--type", dest="job_type", help="the jobs of this job type")
    cancel.add_argument("--queue", help="the jobs of this queue")
    cancel.add_argument("--group-key", help="the jobs of this group key")
    cancel.add_argument("--by", help="who acts (with --reason: recorded on each job)")
    cancel.add_argument("--reason", help="why (with --by: recorded on each job)")
    cancel.add_argument("--dry-run", action="store_true", help="show what would change")
    json_option(cancel)

    run_now = command(
        "run-now", _run_now, "make queued or failed jobs that wait for a later time due now"
    )
    run_now.add_argument("job_ids", type=job_id, nargs="+", metavar="ID", help="the jobs' ids")
    run_now.add_argument("--by", required=True, help="who acts (recorded on each job)")
    run_now.add_argument("--reason", required=True, help="why (recorded on each job)")
    json_option(run_now)

    reschedule = command("reschedule", _reschedule, "give a queued or failed job a new run time")
    reschedule.add_argument("job_id", type=job_id, metavar="ID", help="the job's id")
    reschedule.add_argument(
        "--at", required=True, help="ISO 8601 (UTC when it names no zone) or +30m, in 2h"
    )
    reschedule.add_argument("--by", required=True, help="who acts (recorded on the job)")
    reschedule.add_argument("--reason", required=True, help="why (recorded on the job)")
    json_option(reschedule)

    prune = command("prune", _prune, "delete finished jobs older than --older-than")
    prune.add_argument("--older-than", required=True, help="duration: 0, 90s, 30m, 12h, 7d")
    prune.add_argument(
        "--status",
        dest="statuses",
        action="append",
        choices=["succeeded", "cancelled", "dead"],
        help="repeatable (default: succeeded and cancelled)",
    )
    prune.add_argument(
        "--batch-size",
        type=int,
        default=1000,
        help="jobs deleted per transaction, so none holds locks for long (default 1000)",
    )
    json_option(prune)

    pause = command("pause", _pause, "stop workers claiming from a queue (running jobs finish)")
    pause.add_argument("queue_name", metavar="QUEUE", help="the queue's name")
    pause.add_argument("--by", required=True, help="who pauses it (shown with the pause)")
    pause.add_argument("--reason", required=True, help="why (shown with the pause)")
    pause.add_argument(
        "--force",
        action="store_true",
        help="pause a queue that has never had a job (otherwise refused: a typo?)",
    )
    json_option(pause)
    resume = command("resume", _resume, "let workers claim from a paused queue again")
    resume.add_argument("queue_name", metavar="QUEUE", help="the queue's name")
    json_option(resume)
    limit = command("limit", _limit, "cap a queue's running jobs across all workers")
    limit.add_argument("queue_name", metavar="QUEUE", help="the queue's name")
    limit.add_argument("limit", metavar="N|none", help="at most N at once; none lifts the cap")
    json_option(limit)


# -- dead jobs -------------------------------------------------------------------------------


def _dead_list(queue: Queue, args: argparse.Namespace) -> int:
    jobs = queue.jobs(
        status="dead",
        unhandled=args.unhandled,
        limit=args.limit,
        before_id=args.before_id,
        **filters_of(queue, args),
    )
    print_jobs(jobs, args, dead=True)
    return 0


def _dead_requeue(queue: Queue, args: argparse.Namespace) -> int:
    return _dead_action(queue, args, "requeue")


def _dead_discard(queue: Queue, args: argparse.Namespace) -> int:
    return _dead_action(queue, args, "discard")


def _dead_action(queue: Queue, args: argparse.Namespace, verb: str) -> int:
    if not args.dry_run and not (args.by and args.reason):
        raise ConfigurationError(
            f"{verb} needs --by and --reason (recorded on each job); --dry-run needs neither"
        )
    if args.limit is not None and args.limit < 0:
        raise ConfigurationError(f"--limit must be >= 0, got {args.limit}")
    filters = filters_of(queue, args)
    ids = [*args.job_ids, *(parse_ids(args.ids) or [])] or None
    filtered = any(value is not None for value in filters.values())
    if ids is not None and not filtered and not args.all and args.limit is None:
        return _dead_each(queue, args, verb, ids)
    if not args.all and ids is None and not filtered:
        raise ConfigurationError(
            f"refusing to {verb} every dead job: give job ids or a filter (--type, --queue, "
            "--error-contains, --since, --until) or --all"
        )
    if args.dry_run:
        matching = every_job(
            queue, args.limit, status="dead", unhandled=True, job_ids=ids, **filters
        )
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
        print(f"requeued {len(done)} dead job(s) as new job(s): {id_list(done)}")
    else:
        print(f"discarded {len(done)} dead job(s): {id_list(done)}")
    return 0


def _dead_each(queue: Queue, args: argparse.Namespace, verb: str, ids: list[int]) -> int:
    """Requeue or discard each of ``ids`` on its own, saying what became of every one; exit 1
    if any could not be (not there, not dead, already requeued), the others acted on all the
    same. A dry run says what each would do."""
    outcomes: list[dict[str, Any]] = []
    for dead_id in dict.fromkeys(ids):  # each once, in the order given
        try:
            if args.dry_run:
                outcomes.append({"id": dead_id, "would": _would(queue, dead_id, verb)})
            elif verb == "requeue":
                new_id = queue.requeue(dead_id, by=args.by, reason=args.reason)
                outcomes.append({"id": dead_id, "requeued_as": new_id})
            else:
                queue.discard(dead_id, by=args.by, reason=args.reason)
                outcomes.append({"id": dead_id, "discarded": True})
        except JobStateError as error:  # JobNotFound included
            outcomes.append({"id": dead_id, "error": str(error)})
    if args.json:
        print(json_text({"dry_run": args.dry_run, "jobs": outcomes}))
    else:
        for outcome in outcomes:
            print(f"job {outcome['id']}: {_said(outcome)}")
    return EXIT_ALARM if any("error" in outcome for outcome in outcomes) else 0


def _would(queue: Queue, dead_id: int, verb: str) -> str:
    """What requeueing or discarding ``dead_id`` would do, or the error it would raise."""
    job = queue.get_job(dead_id)
    if job is None:
        raise JobStateError(f"there is no job {dead_id}")
    if job.status != JobStatus.DEAD:
        raise JobStateError(f"job {dead_id} is {job.status.value}; only dead jobs can be {verb}d")
    if job.requeued_as is not None:
        raise JobStateError(f"job {dead_id} was already requeued as job {job.requeued_as}")
    return f"would {verb} it"


def _said(outcome: dict[str, Any]) -> str:
    if "error" in outcome:
        return f"error: {outcome['error']}"
    if "would" in outcome:
        return str(outcome["would"])
    if "requeued_as" in outcome:
        return f"requeued as job {outcome['requeued_as']}"
    return "discarded"


# -- cancel, prune, pause, resume -----------------------------------------------------------


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
                for job in every_job(queue, None, status=status, **where)
            ]
        print(
            json_text({"dry_run": True, "would_cancel": [j.id for j in jobs]})
            if args.json
            else f"would cancel {len(jobs)} job(s): {id_list([j.id for j in jobs])}"
        )
        return 0
    who = {"by": args.by, "reason": args.reason}
    if args.job_ids:
        return _cancel_each(queue, args.job_ids, as_json=args.json, **who)
    count = queue.cancel_where(
        job_type=args.job_type, queue=args.queue, group_key=args.group_key, **who
    )
    print(json_text({"cancelled": count}) if args.json else f"cancelled {count} job(s)")
    return 0


def _run_now(queue: Queue, args: argparse.Namespace) -> int:
    count = queue.run_now(args.job_ids, by=args.by, reason=args.reason)
    print(json_text({"made_due": count}) if args.json else f"{count} job(s) made due now")
    return 0


def _reschedule(queue: Queue, args: argparse.Namespace) -> int:
    run_at = parse_run_time(args.at, now=queue.database_now(), option="--at")
    job = queue.reschedule(args.job_id, run_at, by=args.by, reason=args.reason)
    if args.json:
        print(json_text({"id": job.id, "next_run_at": job.next_run_at.isoformat()}))
    else:
        print(f"job {job.id}: runs at {job.next_run_at:%Y-%m-%d %H:%M:%S} UTC")
    return 0


def _cancel_each(
    queue: Queue,
    job_ids: list[int],
    *,
    as_json: bool,
    by: str | None = None,
    reason: str | None = None,
) -> int:
    """Cancel each job on its own, saying what became of every one; exit 1 if any could not
    be cancelled (not there, or already finished) — the others are cancelled all the same."""
    outcomes: list[dict[str, Any]] = []
    for job_id_ in job_ids:
        try:
            job: Job = queue.cancel(job_id_, by=by, reason=reason)
        except JobStateError as error:  # JobNotFound included
            outcomes.append({"id": job_id_, "error": str(error)})
            continue
        state = "stop requested" if job.status == JobStatus.RUNNING else job.status.value
        outcomes.append({"id": job_id_, "status": state})
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
        return 0
    which = " or ".join(statuses)
    when = (
        "however recently they finished"
        if older_than == 0
        else f"that finished over {spoken_duration(older_than)} ago"
    )
    print(f"deleted {deleted} {which} job(s) {when}")
    return 0


def _pause(queue: Queue, args: argparse.Namespace) -> int:
    name = args.queue_name
    if not args.force and name not in queue.stats().queues and name not in queue.paused_queues():
        raise ConfigurationError(
            f"queue {name!r} has never had a job (a typo?): pass --force to pause it all the "
            "same, before its first job"
        )
    queue.pause(name, by=args.by, reason=args.reason)
    if args.json:
        print(json_text({"queue": name, "paused": True, "by": args.by, "reason": args.reason}))
    else:
        print(f"queue {name!r} paused: workers stop claiming from it")
    return 0


def _resume(queue: Queue, args: argparse.Namespace) -> int:
    name = args.queue_name
    was_paused = queue.resume(name)
    if args.json:
        print(json_text({"queue": name, "paused": False, "was_paused": was_paused}))
    else:
        print(f"queue {name!r} resumed" if was_paused else f"queue {name!r} was not paused")
    return 0


def _limit(queue: Queue, args: argparse.Namespace) -> int:
    name, text = args.queue_name, args.limit.strip()
    maximum = None if text.lower() == "none" else ascii_number(text)
    if maximum is None and text.lower() != "none":
        raise ConfigurationError(f"limit must be a whole number >= 1 or none, got {text!r}")
    queue.set_queue_limit(name, maximum)
    if args.json:
        print(json_text({"queue": name, "max_running": maximum}))
    elif maximum is None:
        print(f"queue {name!r}: no limit of running jobs")
    else:
        print(f"queue {name!r}: at most {maximum} job(s) running at once across all workers")
    return 0
